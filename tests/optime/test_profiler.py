"""``profile_layouts``: an op that cannot run alone from its traced inputs is reported, not a traceback."""

from __future__ import annotations

import torch

import echo_tune as et

from .conftest import CLUSTER, MODEL


def test_an_op_the_device_refuses_alone_is_reported_and_the_rest_measured(tmp_path, one_thread):
    # a bf16 LayerNorm model on a CPU: the in-place run's LayerNorm backward differs from the traced one (fp32
    # statistics), and the CPU kernel refuses the traced inputs alone ("expected scalar type BFloat16 but found
    # Float"): `profile` raised that RuntimeError for every LayerNorm model in bf16
    from echo_tune.cost.optime.optime_db import OpTimeDB
    from echo_tune.cost.optime.optime_device import local_device
    from echo_tune.optime.profiler import profile_layouts

    model, cluster = et.load_model(str(MODEL)).replace(normalization="LayerNorm"), et.load_cluster(str(CLUSTER))
    device, info = local_device("cpu")
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        result = profile_layouts(model, cluster, 1, [et.ParallelConfig(global_batch_size=2, precision="bf16")],
                                 db, device, info)
    assert result.measured > 0 and result.measured + len(result.not_run) == result.total
    assert any(entry.startswith("aten.native_layer_norm_backward (") for entry in result.not_run), result.not_run
    assert torch.get_num_threads() == 1
