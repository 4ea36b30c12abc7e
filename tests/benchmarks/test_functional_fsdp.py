"""Megatron's functional-test cases that use Megatron-FSDP simulate (sim/data_parallel/fsdp.py)."""

from functional_coverage import coverage

# the corpus' cases with --use-megatron-fsdp; the two deepseek_proxy_fsdp_ep2_fsdp2 cases (GB200) set
# --fp8-format without --bf16, which another rule rejects (fp8 needs bf16 parameters)
FSDP_CASES = ("gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor",
              "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor_1node",
              "moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap",
              "moe/gpt3_mcore_te_tp2_zp_z3_resume_torch_dist_te_8experts2parallel_top2router")


def test_megatron_fsdp_cases_simulate():
    result = coverage(list(FSDP_CASES), cache_dir=None)
    assert all("--use-megatron-fsdp" in case["line"] for case in result["cases"])
    assert result["counts"]["simulated"] == len(FSDP_CASES)
