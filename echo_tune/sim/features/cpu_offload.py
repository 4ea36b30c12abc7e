"""Activation offloading to host memory: ``--cpu-offloading-num-layers N`` (Megatron-LM d98e8a64ddf3).

arguments.py turns ``cpu_offloading`` on for N > 0, and the transformer block wraps its layers in Transformer
Engine's ``get_cpu_offload_context`` (transformer_block.py; activations only, ``cpu_offloading_weights`` off,
no double buffering by default). The activations each of the first N layers saves for its backward are copied to
pinned host memory on a side stream while the next layer's forward runs, and copied back ahead of their backward
while the layer after them runs its backward (TE ``AsyncDoubleBufferGroupOffloadHandler``: one layer group in
transit each way). So:

- memory: of a chunk's L layers, L - N keep their activations on the GPU, plus the one offloaded layer in transit
  (``kept_fraction``);
- time: per micro-batch and offloaded layer, the copy out is exposed where it is longer than one layer's forward,
  the copy back where it is longer than one layer's backward (the part ``offload`` of the step). The copies run on
  the copy engines (DMA), not on the SMs: compute is not slowed beside them.

The host link per GPU and direction (``HOST_LINK_GBYTE_S``): NVLink-C2C on a Grace superchip, 900 GB/s
bidirectional between one Grace CPU and its two Blackwell GPUs (NVIDIA GB200 superchip description; GB300
likewise), taken as shared evenly while both GPUs copy: 225 GB/s per GPU and direction; PCIe 5.0 x16 on x86 hosts
(DGX H100 / B200): 32 GT/s x 16 lanes with 128b/130b encoding = 63 GB/s per direction (PCI-SIG PCIe 5.0
specification). Datasheet-derived, not measured.
"""

from __future__ import annotations

from echo_tune.sim.schedule.costing import PhaseCost

PCIE5_X16_GBYTE_S = 63.0
HOST_LINK_GBYTE_S = {"gb200": 225.0, "gb300": 225.0}
"""GPUs on a Grace superchip; every other GPU copies over PCIe 5.0 x16 (``PCIE5_X16_GBYTE_S``)."""


def host_link_gbyte_s(gpu_name: str) -> float:
    """Bandwidth of one GPU's copies to or from host memory, per direction."""
    return HOST_LINK_GBYTE_S.get(gpu_name, PCIE5_X16_GBYTE_S)


def kept_fraction(layers: int, offloaded: int) -> float:
    """Share of a chunk's layer activations that stay on the GPU at the end of a forward: the layers not offloaded
    and the one in transit."""
    if offloaded <= 0 or layers <= 0:
        return 1.0
    return min(1.0, (layers - offloaded + 1) / layers)


def offload_costs(fwd: PhaseCost, bwd: PhaseCost, *, layers: int, offloaded: int, layer_bytes: float,
                  gpu_name: str) -> tuple[PhaseCost, PhaseCost]:
    """The exposed copies of one micro-batch's forward and backward over a chunk of ``layers`` layers, of which
    ``offloaded`` save ``layer_bytes`` each to the host (``offload_s``)."""
    if offloaded <= 0 or layers <= 0:
        return PhaseCost(), PhaseCost()
    copy_s = layer_bytes / (host_link_gbyte_s(gpu_name) * 1e9)
    out = offloaded * max(0.0, copy_s - fwd.total_s / layers)
    back = offloaded * max(0.0, copy_s - bwd.total_s / layers)
    return PhaseCost(offload_s=out), PhaseCost(offload_s=back)


def offload_notes(offloaded: int, layer_bytes: float, gpu_name: str) -> tuple[str, ...]:
    if offloaded <= 0:
        return ()
    link = host_link_gbyte_s(gpu_name)
    how = "NVLink-C2C, shared by the superchip's two GPUs" if gpu_name in HOST_LINK_GBYTE_S else "PCIe 5.0 x16"
    return (f"--cpu-offloading-num-layers {offloaded}: {layer_bytes / 2**30:.2f} GiB of activations per layer and "
            f"micro-batch copied to the host and back at {link:.0f} GB/s ({how}; datasheet-derived); the part "
            f"beyond one layer's compute is 'offload'",)
