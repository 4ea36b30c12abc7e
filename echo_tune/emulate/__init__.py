"""``echo-tune emulate`` (NeuronaBox's idea): run one pipeline stage of a layout for real on the local
device, with every collective and p2p transfer replaced by a wait of its modelled duration, and compare
the measured stage with the simulator's prediction part by part.

- ``build.py``: the stage's real sharded modules, from the tracer's own layer definitions.
- ``predict.py``: the simulator's view of the same stage (its parts, its neighbours' task times).
- ``run.py``: the stage's micro-batches in Megatron's task order, with the waits.
- ``moe.py``: MoE layers run for real (balanced routing, received buffers, the experts' timer, refusals).
"""
