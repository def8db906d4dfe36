"""The interactive KV calculator of lesson 01 (ipywidgets): pick a model, context, sequences, dtype, memory."""

from __future__ import annotations

from typing import Any

from kvlab import sizing
from kvlab.sizing import memory_split

CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def kv_calculator(preset: str = "Llama-3.1-8B", context: int = 8192, sequences: int = 16, dtype: str = "bf16",
                  memory_gib: float = 80.0, utilization: float = sizing.VLLM_MEMORY_UTILIZATION,
                  overhead_gib: float = sizing.DEFAULT_OVERHEAD_GIB["gpu"]) -> Any:
    """A small form that redraws the memory split (weights | KV | headroom) whenever a control moves; usable memory is
    vLLM's share of the card less the engine's other needs (``sizing.plan_kv_capacity``'s defaults)."""
    import ipywidgets as w
    from IPython.display import display

    controls = {
        "preset": w.Dropdown(options=sizing.list_presets(), value=preset, description="model"),
        "context": w.SelectionSlider(options=CONTEXTS, value=context, description="context"),
        "sequences": w.IntSlider(value=sequences, min=1, max=256, description="sequences"),
        "dtype": w.Dropdown(options=["fp32", "bf16", "fp8"], value=dtype, description="KV dtype"),
        "memory_gib": w.FloatSlider(value=memory_gib, min=8, max=192, step=1, description="memory GiB"),
    }
    out = w.Output()

    def redraw(*_: Any) -> None:
        v = {k: c.value for k, c in controls.items()}
        arch = sizing.load_arch(v["preset"])
        kv = sizing.kv_bytes(arch, v["context"], v["dtype"], v["sequences"], block_size=16)
        plan = sizing.plan_kv_capacity(arch, v["memory_gib"], v["context"], utilization, v["dtype"], target_sequences=v["sequences"],
                                    overhead_gib=overhead_gib)
        usable = v["memory_gib"] * utilization - overhead_gib
        out.clear_output(wait=True)
        with out:
            display(memory_split(arch.name, plan.weight_gib, kv / sizing.GiB, usable, v["sequences"], v["context"], plan))

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([controls["preset"], controls["dtype"]]), controls["context"], controls["sequences"],
                   controls["memory_gib"], out])
