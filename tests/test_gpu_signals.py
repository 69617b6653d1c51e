"""Per-step GPU signals (device used, outside PyTorch, reserved − allocated, retries, OOMs)
from step-phase events carrying the ``cuda`` backend's device readings, in the steps section,
the Markdown and the HTML payload; and what a backend without them says instead."""

from __future__ import annotations

from memscope.analysis.base import replay
from memscope.analysis.runtime_sections import runtime_analyzers
from memscope.analysis.static_comparison import StaticEstimate
from memscope.events.schema import (
    PHASE_FORWARD_BACKWARD,
    PHASE_OPTIMIZER,
    PHASE_PRE_OPTIMIZER,
    PHASE_STEP,
    STEP_PHASE,
    MemoryEvent,
)
from memscope.reporters.html import render_runtime_html
from memscope.reporters.html_payload import runtime_payload
from memscope.reporters.markdown import render_runtime_markdown
from memscope.reporters.runtime_json import RuntimeReportInputs, build_runtime_report

MiB = 1 << 20
CUDA_META = {"rank": 0, "world_size": 1, "backend": "cuda", "device_name": "NVIDIA H100"}
CPU_META = {"rank": 0, "world_size": 1, "backend": "storage",
            "backend_info": {"backend": "storage", "device_type": "cpu"}}  # fmt: skip


def _device(used_mib: int, retries: int, ooms: int) -> dict[str, int]:
    """What ``CudaAllocatorBackend.sample(detailed=True)`` records (capture/backends/cuda.py)."""
    return {"active_bytes": 40 * MiB, "num_alloc_retries": retries, "num_ooms": ooms,
            "device_used_bytes": used_mib * MiB, "device_total_bytes": 80 << 30,
            "peak_exact": 1}  # fmt: skip


def _step_events(step: int, seq: int, used_mib: int, retries: int, ooms: int) -> list[MemoryEvent]:
    """The four step-phase events of one step: 40 MiB allocated, 64 MiB reserved at the end."""
    out = []
    for k, phase in enumerate(
        (PHASE_FORWARD_BACKWARD, PHASE_PRE_OPTIMIZER, PHASE_OPTIMIZER, PHASE_STEP)
    ):
        out.append(
            MemoryEvent(
                seq=seq + k, event_type=STEP_PHASE, phase=phase, step=step, module="",
                timestamp=step + k / 4, rank=0, mem_allocated_before=40 * MiB,
                mem_allocated_after=40 * MiB, mem_reserved_before=64 * MiB,
                mem_reserved_after=64 * MiB, max_mem_allocated=50 * MiB,
                max_mem_reserved=64 * MiB, device=_device(used_mib, retries, ooms),
            )
        )  # fmt: skip
    return out


def _report(events: list[MemoryEvent], meta: dict) -> dict:
    sections = replay(events, runtime_analyzers(5, StaticEstimate(None, "none")))
    # through the schema's own round trip, as a trace replay would read them
    events = [MemoryEvent.from_dict(e.to_dict()) for e in events]
    return build_runtime_report(
        RuntimeReportInputs(dict(meta), "complete", sections, events, {"events_recorded": 0})
    )


def _cuda_report() -> dict:
    events = (
        _step_events(0, 1, used_mib=70, retries=0, ooms=0)
        + _step_events(1, 5, used_mib=72, retries=3, ooms=0)
        + _step_events(2, 9, used_mib=75, retries=4, ooms=1)
    )
    return _report(events, CUDA_META)


def test_steps_carry_device_used_outside_pytorch_cached_free_and_counters():
    steps = _cuda_report()["steps"]
    last = steps[-1]
    assert last["device_used_end"] == 75 * MiB
    assert last["outside_pytorch_end"] == 75 * MiB - 64 * MiB
    assert last["cached_free_end"] == 64 * MiB - 40 * MiB
    assert (last["alloc_retries_total"], last["ooms_total"]) == (4, 1)
    assert (last["alloc_retries"], last["ooms"]) == (1, 1)  # since step 1
    assert (steps[1]["alloc_retries"], steps[1]["ooms"]) == (3, 0)
    assert "alloc_retries" not in steps[0]  # nothing listed before it


def test_markdown_shows_the_gpu_signals_per_step():
    text = render_runtime_markdown(_cuda_report())
    section = text.split("## GPU signals per step")[1].split("\n## ")[0]
    assert (
        "| step | device used | outside PyTorch | reserved − allocated | alloc retries | OOMs |"
        in section
    )
    assert "| 2 | 75.00 MiB | 11.00 MiB | 24.00 MiB | 1 | 1 |" in section
    assert "| 0 | 70.00 MiB | 6.00 MiB | 24.00 MiB | n/a | n/a |" in section
    assert "4 allocation retries, 1 OOMs" in section
    assert "- reserved peak: 64.00 MiB" in text


def test_html_page_has_the_gpu_signals_and_no_unavailable_note():
    payload = runtime_payload(_cuda_report())
    assert payload["notes"]["gpu_signals"] == "" and payload["notes"]["reserved"] == ""
    assert payload["steps"]["device_used_end"] == [70 * MiB, 72 * MiB, 75 * MiB]
    assert payload["steps"]["alloc_retries"] == [None, 3, 1]
    assert payload["gpu_totals"] == {"alloc_retries_total": 4, "ooms_total": 1}
    html = render_runtime_html(payload)
    assert 'id="gpu"' in html and "GPU signals per step" in html


def test_a_cpu_report_says_which_backend_gives_gpu_signals_and_reserved():
    report = _report(
        [
            MemoryEvent(
                seq=1, event_type=STEP_PHASE, phase=PHASE_STEP, step=0, module="", timestamp=1.0,
                rank=0, mem_allocated_before=MiB, mem_allocated_after=MiB,
                mem_reserved_before=MiB, mem_reserved_after=MiB, max_mem_allocated=2 * MiB,
                max_mem_reserved=2 * MiB, device={"live_storages": 12},
            )
        ],
        CPU_META,
    )  # fmt: skip
    assert "device_used_end" not in report["steps"][0]
    text = render_runtime_markdown(report)
    section = text.split("## GPU signals per step")[1].split("\n## ")[0]
    assert "Not available with the storage backend" in section
    assert "--memscope-backend cuda" in section
    assert "- reserved peak: n/a (no caching allocator on CPU" in text
    assert "--memscope-enable-memory-snapshot" in text.split("### Live at the peak")[1]
    notes = runtime_payload(report)["notes"]
    assert "--memscope-backend cuda" in notes["gpu_signals"]
    assert notes["reserved"].startswith("no caching allocator on CPU")
    assert "--memscope-backend storage" in notes["composition"]
