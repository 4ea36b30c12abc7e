"""config/rules/fsdp_rules.py: Megatron-FSDP's rules (Megatron-LM d98e8a64ddf3 training/arguments.py)."""

import pytest

import echo_tune as et
from echo_tune.config.rules.fsdp_rules import check_fsdp
from echo_tune.errors import ConfigError

FSDP = et.ParallelConfig(use_megatron_fsdp=True, global_batch_size=64)


def test_v1_turns_on_the_distributed_optimizer_and_nccl_ub_the_double_buffer():
    effective = check_fsdp(FSDP.replace(nccl_ub=True))
    assert effective.use_distributed_optimizer and effective.fsdp_double_buffer


@pytest.mark.parametrize("changes, rule", [
    ({"data_parallel_sharding_strategy": "zero3"}, "data_parallel_sharding_strategy"),
    ({"megatron_fsdp_grad_comm_dtype": "fp8"}, "megatron_fsdp_grad_comm_dtype"),
    ({"outer_dp_sharding_strategy": "optim", "data_parallel_sharding_strategy": "optim_grads"},
     "outer_dp_sharding_strategy == 'optim'"),
    ({"overlap_moe_expert_parallel_comm": True, "fsdp_double_buffer": True}, "double buffer"),
    ({"use_megatron_fsdp": False, "nccl_ub": True}, "use_nccl_ub"),
    ({"use_megatron_fsdp": False, "fsdp_double_buffer": True}, "fsdp_double_buffer"),
])
def test_rules_are_one_line_config_errors(changes, rule):
    with pytest.raises(ConfigError, match=rule) as err:
        check_fsdp(FSDP.replace(**changes))
    assert "\n" not in str(err.value)
