"""The exact storage ledger: allocations, frees, views, autograd-saved tensors, true peaks."""

import types

import pytest
import torch

from memscope.capture.backends.storage import StorageLedgerBackend
from memscope.events.schema import CAT_ACTIVATIONS, CAT_GRADIENTS, CAT_OPTIMIZER_STATE, CAT_OTHER


def _ledger() -> StorageLedgerBackend:
    ledger = StorageLedgerBackend("cpu")
    ledger.start()
    return ledger


def test_allocation_and_free_are_counted_exactly():
    ledger = _ledger()
    try:
        base = ledger.sample().allocated
        t = torch.empty(1000, dtype=torch.float32)
        assert ledger.sample().allocated - base == 4000
        del t
        assert ledger.sample().allocated == base
    finally:
        ledger.stop()


def test_views_share_one_storage_until_the_last_view_dies():
    ledger = _ledger()
    try:
        base = ledger.sample().allocated
        t = torch.zeros(256, dtype=torch.float64)
        v = t[10:20].view(2, 5)
        assert ledger.sample().allocated - base == 2048
        del t
        assert ledger.sample().allocated - base == 2048  # the view keeps the storage alive
        del v
        assert ledger.sample().allocated == base
    finally:
        ledger.stop()


def test_tensor_saved_for_backward_stays_counted_until_graph_is_freed():
    ledger = _ledger()
    try:
        x = torch.randn(100, requires_grad=True)
        base = ledger.sample().allocated
        y = x.exp()  # exp saves its result
        loss = y.sum()
        del y
        after_forward = ledger.sample().allocated - base
        assert after_forward >= 400  # y's 400 bytes are still held by the graph
        loss.backward()
        del loss
        # After backward the graph is gone: only x.grad (400 B) remains beyond base.
        assert ledger.sample().allocated - base == 400
    finally:
        ledger.stop()


def test_peak_between_samples_is_the_true_running_peak():
    ledger = _ledger()
    try:
        ledger.reset_peak()
        base = ledger.sample().allocated
        tmp = torch.empty(10_000, dtype=torch.uint8)  # 10 kB temporary...
        del tmp  # ...freed before anyone samples
        s = ledger.sample()
        assert s.allocated == base
        assert s.peak_allocated - base == 10_000
        ledger.reset_peak()
        assert ledger.sample().peak_allocated == base
    finally:
        ledger.stop()


def test_categories_follow_alloc_category_mark_and_window_promotion():
    ledger = _ledger()
    try:
        ledger.categorizer().set_alloc_category(CAT_ACTIVATIONS)
        act = torch.empty(10, dtype=torch.float32)
        cats = ledger.live_bytes_by_category()
        assert cats["activations"] >= 40
        ledger.categorizer().mark(act, CAT_GRADIENTS)
        cats2 = ledger.live_bytes_by_category()
        assert cats2["gradients"] - cats["gradients"] == 40
        assert cats["activations"] - cats2["activations"] == 40

        ledger.categorizer().set_alloc_category(CAT_OTHER)
        ledger.categorizer().open_window()
        kept = torch.ones(8, dtype=torch.float32)
        temp = torch.ones(16, dtype=torch.float32)
        del temp
        before = ledger.live_bytes_by_category()["optimizer_state"]
        moved = ledger.categorizer().promote_window(CAT_OPTIMIZER_STATE)
        assert moved == 32
        assert ledger.live_bytes_by_category()["optimizer_state"] - before == 32
        del kept
    finally:
        ledger.stop()


def test_tensors_made_before_start_are_adopted():
    early = torch.empty(123, dtype=torch.uint8)
    ledger = StorageLedgerBackend("cpu")
    ledger.start()
    try:
        before = ledger.sample().allocated
        assert ledger.categorizer().adopt_existing() >= 1
        assert ledger.sample().allocated - before >= 123
        del early
    finally:
        ledger.stop()


def test_storage_resize_is_tracked():
    ledger = _ledger()
    try:
        t = torch.empty(10, dtype=torch.float32)
        base = ledger.sample().allocated
        t.resize_(100)
        assert ledger.sample().allocated - base == 360
    finally:
        ledger.stop()


def test_stop_removes_the_dispatch_mode():
    ledger = _ledger()
    ledger.stop()
    before = ledger.sample().allocated
    t = torch.empty(1000)
    assert ledger.sample().allocated == before
    del t


def test_peak_composition_is_the_live_set_at_the_peak_by_creation_context():
    from memscope.events.schema import PeakContext

    ledger = _ledger()
    try:
        ledger.categorizer().set_alloc_category(CAT_ACTIVATIONS)
        ledger.context = PeakContext(0, "forward", "layer.a", 0, 1)
        a = torch.empty(1000, dtype=torch.uint8)
        ledger.context = PeakContext(0, "forward", "layer.b", 1, 1)
        b = torch.empty(3000, dtype=torch.uint8)
        del b  # the peak was a + b
        ledger.context = PeakContext(0, "backward", "layer.c", 1, 1)
        c = torch.empty(500, dtype=torch.uint8)
        # a later re-categorisation does not rewrite the peak
        ledger.categorizer().mark(a, CAT_GRADIENTS)
        items = ledger.peak_composition()
        assert items is not None
        got = {
            (i.category, i.phase, i.module, i.microbatch, i.virtual_chunk): i.nbytes for i in items
        }
        assert got == {
            ("activations", "forward", "layer.b", 1, 1): 3000,
            ("activations", "forward", "layer.a", 0, 1): 1000,
        }
        assert [i.nbytes for i in items] == [3000, 1000]
        assert sum(got.values()) == ledger.sample().peak_allocated
        ledger.reset_peak()  # a new window starts from what is live now: a (gradient) and c
        now = {(i.category, i.module): i.nbytes for i in ledger.peak_composition() or ()}
        assert now == {("gradients", "layer.a"): 1000, ("activations", "layer.c"): 500}
        del a, c
    finally:
        ledger.stop()


def test_storages_autograd_saves_are_told_apart_from_temporaries():
    from memscope.capture.category_policy import CategoryPolicy

    ledger = _ledger()
    policy = CategoryPolicy(ledger.categorizer())
    try:
        weight = torch.randn(64, 64, requires_grad=True)
        policy.step_started()  # pushes the pass-through saved-tensor hooks
        x = torch.randn(8, 64)
        hidden = torch.tanh(x @ weight)  # tanh saves its output; the matmul saves x
        temporary = hidden * 2 + 1  # not needed for backward: a temporary
        policy.phase_ended("forward_backward", "pre_optimizer")  # pops them
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
        items = ledger.peak_composition() or ()
        kinds = {}
        for item in items:
            if item.category == "activations":
                kinds[item.saved] = kinds.get(item.saved, 0) + item.nbytes
        assert kinds[True] == hidden.numel() * 4 + x.numel() * 4
        assert kinds[False] >= temporary.numel() * 4
        assert (temporary * 0).sum().item() == 0  # training's tensors are untouched
        hidden.sum().backward()
        assert weight.grad is not None
    finally:
        policy.pop_saved_hooks()
        ledger.stop()


def test_the_saved_tensor_hooks_free_memory_as_without_them():
    """A saved output must not keep its own graph alive in a reference cycle: with the hooks
    pushed, dropping a graph that never ran backward frees its storage at once, garbage
    collector off (returning the packed tensor itself would not)."""
    import gc
    import weakref

    from memscope.capture.category_policy import CategoryPolicy

    ledger = _ledger()
    policy = CategoryPolicy(ledger.categorizer())
    gc.disable()
    try:
        weight = torch.randn(32, 32, requires_grad=True)
        reference = weight.detach().clone().requires_grad_()
        torch.tanh(reference @ reference).sum().backward()  # no hooks
        policy.step_started()
        out = torch.tanh(weight @ weight)  # tanh saves its own output
        storage = weakref.ref(out.untyped_storage())
        del out
        assert storage() is None
        again = torch.tanh(weight @ weight)
        again.sum().backward()  # and backward computes through the hooks
        policy.pop_saved_hooks()
        assert torch.equal(weight.grad, reference.grad)  # bit-identical gradients
    finally:
        gc.enable()
        policy.pop_saved_hooks()
        ledger.stop()


def test_a_capacity_limit_fails_an_op_as_a_full_device_would_and_keeps_accounting():
    ledger = StorageLedgerBackend("cpu", capacity_bytes=3 * 4096)
    ledger.start()
    try:
        a = torch.zeros(1024)  # 4 KiB
        b = torch.zeros(1024)
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 8192 bytes"):
            torch.zeros(2048)  # 8 KiB more: over 12 KiB
        assert ledger.sample().allocated == 8192 and ledger.error is None  # still exact
        c = torch.zeros(1024)  # what fits still fits
        assert ledger.sample().allocated == 3 * 4096
        del a, b, c
    finally:
        ledger.stop()


def test_a_phase_peak_is_the_highest_level_since_the_phase_began_not_the_steps():
    ledger = _ledger()
    try:
        base = ledger.sample().allocated
        big = torch.empty(10_000, dtype=torch.uint8)  # the step's high-water mark
        del big
        ledger.mark_phase()  # a later phase: it never comes near the step's mark
        t = torch.empty(3000, dtype=torch.uint8)
        u = torch.empty(1000, dtype=torch.uint8)
        del t, u
        sample = ledger.sample()
        assert sample.allocated == base
        assert sample.peak_allocated == base + 10_000
        assert sample.phase_peak_allocated == base + 4000  # both temporaries live at once
        ledger.mark_phase()
        assert ledger.sample().phase_peak_allocated == base
    finally:
        ledger.stop()


def test_a_last_use_orders_exactly_against_events_of_the_same_microsecond(monkeypatch):
    """The history's stamps never tie, so an allocation made in the microsecond of a block's
    last use still counts as after it, and the peak drop of freeing it is exact."""
    from memscope.analysis.lifetimes import idle_at_peak
    from memscope.capture.backends import storage_history

    stopped = types.SimpleNamespace(time_ns=lambda: 1_000_000_000)  # a clock that stands still
    monkeypatch.setattr(storage_history, "time", stopped)
    ledger = _ledger()
    try:
        ledger.start_history(1000)
        held = torch.ones(1024, dtype=torch.uint8)  # read once below, then idle
        read = held + 1
        del read
        peak = torch.empty(4096, dtype=torch.uint8)  # the peak: held is idle through it
        del peak
        del held
        snapshot = ledger.history_snapshot()
    finally:
        ledger.stop()
    times = [event["time_us"] for event in snapshot["device_traces"][0]]
    assert times == sorted(set(times))  # strictly increasing although the clock stood still
    idle_bytes, findings = idle_at_peak(snapshot)
    assert idle_bytes == 1024
    assert findings[0].nbytes == 1024 and findings[0].peak_drop == 1024
