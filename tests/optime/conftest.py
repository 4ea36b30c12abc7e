"""A tiny Llama-shaped model profiled on this CPU (one intra-op thread) into a temporary database."""

import dataclasses
from pathlib import Path

import pytest
import torch

import echo_tune as et
from echo_tune.cost.profile import default_profile, load_profile, save_profile

DATA = Path(__file__).parents[1] / "data"
MODEL, CLUSTER = DATA / "tiny-llama.yaml", DATA / "cpu-cluster.yaml"


def tiny_layout(**changes) -> et.ParallelConfig:
    fields = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, global_batch_size=4, precision="fp32")
    return et.ParallelConfig(**{**fields, **changes})


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(model, cluster, layout, profile) with every op of the layout measured on this CPU."""
    from echo_tune.cost.optime.optime_db import OpTimeDB
    from echo_tune.cost.optime.optime_device import local_device
    from echo_tune.optime.profiler import profile_layouts

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("optime")
    model, cluster, layout = et.load_model(str(MODEL)), et.load_cluster(str(CLUSTER)), tiny_layout()
    device, info = local_device("cpu")
    with OpTimeDB(folder / "optime.sqlite") as db:
        profile_layouts(model, cluster, 4, [layout], db, device, info)
    save_profile(dataclasses.replace(default_profile(cluster), op_times_db="optime.sqlite"), folder / "profile.yaml")
    yield model, cluster, layout, load_profile(folder / "profile.yaml")
    torch.set_num_threads(before)
