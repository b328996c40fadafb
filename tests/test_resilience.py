"""resilience.Context: array discovery, in-place restore, labels, filters, and real crashes."""

from __future__ import annotations

import functools
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import python_env

from resilient_flows.checkpoint import read_checkpoint
from resilient_flows.checkpoint._comm import SingleProcess
from resilient_flows.cli import main as cli_main
from resilient_flows.errors import ResilientFlowsError, StateMismatchError
from resilient_flows.resilience import Context, every, find_arrays

WORKER = Path(__file__).with_name("resilience_worker.py")
GLOBAL_ARRAY = np.zeros(3)


def names(fn: object) -> set[str]:
    return set(find_arrays(fn))


# ------------------------------------------------------------------ discovery


def test_closure_cells_are_found_by_variable_name() -> None:
    u, v, n = np.zeros(4), torch.zeros(2), 5
    assert names(lambda: (u, v, n)) == {"u", "v"}


def test_default_and_keyword_only_arguments() -> None:
    a, b = np.zeros(2), np.ones(2)

    def body(x=a, *, y=b, z=3):
        return x + y + z

    assert names(body) == {"x", "y"}


def test_bound_method_finds_instance_attributes_and_method_captures() -> None:
    scratch = np.zeros(2)

    class Solver:
        def __init__(self) -> None:
            self.grid = np.zeros((3, 3))
            self.flux = torch.zeros(3)
            self.steps = 0

        def advance(self) -> None:
            self.grid += scratch.sum()

    solver = Solver()
    assert names(solver.advance) == {"grid", "flux", "scratch"}
    assert names(lambda: solver.advance()) == {"solver.grid", "solver.flux"}


def test_callable_object_finds_attributes_and_call_captures() -> None:
    coeff = np.full(2, 0.5)

    class Kernel:
        def __init__(self) -> None:
            self.field = np.zeros(4)

        def __call__(self, out=np.ones(1)) -> None:  # noqa: B008
            self.field *= coeff[0]

    kernel = Kernel()
    assert names(kernel) == {"field", "coeff", "out"}
    assert names(lambda: kernel()) == {"kernel.field", "kernel.coeff", "kernel.out"}


def test_lists_tuples_dicts_and_partials() -> None:
    fields = [np.zeros(2), np.zeros(3)]
    opts = {"mask": np.ones(2, dtype=bool), 0: np.zeros(1), ("a", 1): [torch.zeros(1)], object(): np.zeros(1)}
    pair = (1, np.zeros(2))
    scaled = functools.partial(np.multiply, np.ones(2), out=np.zeros(2))
    assert names(lambda: (fields, opts, pair, scaled)) == {
        "fields[0]",
        "fields[1]",
        "opts['mask']",
        "opts[0]",
        "opts[('a', 1)][0]",
        "pair[1]",
        "scaled.args[0]",
        "scaled.out",
    }


def test_nested_captured_functions() -> None:
    u, v, w = np.zeros(2), np.zeros(2), np.zeros(2)

    def inner() -> None:
        w[...] = 1

    def step() -> None:
        inner()
        v[...] = u

    assert names(lambda: step()) == {"step.u", "step.v", "step.inner.w"}
    assert names(lambda: (step(), u)) == {"u", "step.v", "step.inner.w"}  # u: first name wins


def test_cycles_shared_arrays_and_globals() -> None:
    a = np.zeros(2)
    loop: list = [a]
    loop.append(loop)

    class Node:
        pass

    node = Node()
    node.me, node.data, node.alias = node, a, a
    found = find_arrays(lambda: (loop, node, GLOBAL_ARRAY))
    assert set(found) == {"loop[0]"}  # cycles end, `a` is saved once, globals are not followed
    assert found["loop[0]"] is a


# ------------------------------------------------------------------ saving and restoring


def test_excluded_array_is_not_saved(tmp_path: Path) -> None:
    u, scratch = np.arange(4.0), np.zeros(4)
    with Context(tmp_path) as ctx:
        ctx.exclude(scratch)
        ctx.checkpoint("x", 0, lambda: (u, scratch))
    step, saved = read_checkpoint(tmp_path / "x")
    assert step == 0
    assert set(saved) == {"u"} and saved["u"].tolist() == [0, 1, 2, 3]


def test_restore_keeps_identity_and_values(tmp_path: Path) -> None:
    u = np.arange(6.0).reshape(2, 3)
    w = torch.arange(4, dtype=torch.float32)
    strided = np.arange(10)[::2]  # not contiguous: restored through a staging copy
    ran: list[int] = []

    def body(i: int) -> None:
        ran.append(i)
        u[...] += 1
        w.add_(1)
        strided[...] += 1

    with Context(tmp_path, filter=every(5)) as ctx:
        for i in range(5):
            ctx.checkpoint("x", i, lambda: body(i))  # noqa: B023
    expected = (u.copy(), w.clone(), strided.copy())
    u[...], strided[...] = -1, -1
    w.zero_()
    ran.clear()
    with Context(tmp_path, filter=every(5)) as ctx:
        assert ctx.latest_version("x") == 4
        assert ctx.checkpoint("x", 4, lambda: body(4)) is None
    assert ran == []  # the restart point is restored, not run
    assert np.array_equal(u, expected[0]) and torch.equal(w, expected[1]) and np.array_equal(strided, expected[2])
    assert set(read_checkpoint(tmp_path / "x")[1]) == {"body.u", "body.w", "body.strided"}


def test_registered_zero_d_array_restores_a_scalar(tmp_path: Path) -> None:
    def run(steps: int) -> tuple[np.ndarray, np.ndarray]:
        field = np.zeros(3)
        time = np.zeros(())
        with Context(tmp_path, filter=every(3)) as ctx:
            ctx.register("time", time)
            start = max(ctx.latest_version("heat"), 0)
            for i in range(start, steps):

                def step() -> None:
                    field[...] += 1
                    time[...] += 0.5

                ctx.checkpoint("heat", i, lambda: step())
        return field, time

    run(6)  # checkpoints after iterations 2 and 5
    field, time = run(8)
    assert float(time) == 4.0 and field.tolist() == [8.0] * 3


def test_changed_shape_after_restart_names_the_array(tmp_path: Path) -> None:
    u, v = np.zeros(4), np.zeros(2)
    with Context(tmp_path) as ctx:
        ctx.checkpoint("x", 0, lambda: (u, v))
    u = np.zeros(5)
    with Context(tmp_path) as ctx, pytest.raises(StateMismatchError, match="'u'"):
        ctx.checkpoint("x", 0, lambda: (u, v))
    assert issubclass(StateMismatchError, ResilientFlowsError)


def test_changed_arrays_within_a_run_are_an_error(tmp_path: Path) -> None:
    u = np.zeros(4)
    body = lambda: u  # noqa: E731
    with Context(tmp_path) as ctx:
        ctx.checkpoint("x", 0, body)
        u = np.zeros(4, dtype=np.float32)  # the closure now sees another array under the same name
        with pytest.raises(StateMismatchError, match=r"'u' was \[4\] float64 and is now \[4\] float32"):
            ctx.checkpoint("x", 1, body)


def test_two_labels_checkpoint_independently(tmp_path: Path) -> None:
    def run(steps: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        a, b = np.zeros(2), np.zeros(2)
        with Context(tmp_path, filter=every(2)) as ctx:
            ctx.filter = lambda label, i: (i + 1) % (2 if label == "fast" else 5) == 0
            la, lb = ctx.latest_version("fast"), ctx.latest_version("slow")
            for i in range(steps):

                def inc_a() -> None:
                    a[...] += 1

                def inc_b() -> None:
                    b[...] += 10

                ctx.checkpoint("fast", i, lambda: inc_a())
                ctx.checkpoint("slow", i, lambda: inc_b())
        return a, b, la, lb

    run(7)  # fast: 1, 3, 5; slow: 4
    assert read_checkpoint(tmp_path / "fast")[0] == 5
    assert read_checkpoint(tmp_path / "slow")[0] == 4
    a, b, la, lb = run(9)
    assert (la, lb) == (5, 4)
    assert a.tolist() == [9, 9] and b.tolist() == [90, 90]


def test_iterations_restores_before_the_first_iteration(tmp_path: Path) -> None:
    def run(steps: int) -> tuple[list[int], torch.Tensor]:
        x = torch.zeros(3)
        done = []
        with Context(tmp_path, filter=every(4)) as ctx:
            for i in ctx.iterations("x", steps):
                done.append(i)
                ctx.checkpoint("x", i, lambda: x.add_(1))
        return done, x

    assert run(6)[0] == list(range(6))
    done, x = run(10)
    assert done == list(range(4, 10)) and x.tolist() == [10.0] * 3


def test_with_a_communicator_arrays_are_saved_per_rank(tmp_path: Path) -> None:
    u = np.arange(3.0)
    with Context(tmp_path, comm=SingleProcess()) as ctx:
        ctx.checkpoint("x", 0, lambda: u)
    assert set(read_checkpoint(tmp_path / "x")[1]["rank_local"]) == {"u"}
    u[...] = 0
    with Context(tmp_path, comm=SingleProcess()) as ctx:
        assert ctx.restore("x", lambda: u) == 0
    assert u.tolist() == [0.0, 1.0, 2.0]


def test_read_only_arrays_are_not_state() -> None:
    u = np.zeros(3)
    frozen = np.broadcast_to(np.ones(1), (3,))
    assert names(lambda: (u, frozen)) == {"u"}


def test_labels_are_ordinary_engine_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    u = np.zeros(2)
    with Context(tmp_path) as ctx:
        ctx.checkpoint("heat", 0, lambda: u)
    assert cli_main(["checkpoints", "list", str(tmp_path / "heat")]) == 0
    assert "yes" in capsys.readouterr().out


def test_every() -> None:
    f = every(10)
    assert [i for i in range(30) if f("x", i)] == [9, 19, 29]
    for bad, match in [((0,), "n"), ((1.5,), "n"), ((), "exactly one")]:
        with pytest.raises(ValueError, match=match):
            every(*bad)
    for seconds in (0, -1, float("inf"), "1"):
        with pytest.raises(ValueError, match="seconds"):
            every(seconds=seconds)
    with pytest.raises(ValueError, match="exactly one"):
        every(2, seconds=1)


def test_every_seconds_is_per_label(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("resilient_flows.resilience._context.time.monotonic", lambda: now[0])
    f = every(seconds=60)
    assert not f("a", 0)
    now[0] = 130.0
    assert not f("a", 1) and not f("b", 0)
    now[0] = 160.0
    assert f("a", 2) and not f("a", 3) and not f("b", 1)
    now[0] = 190.0
    assert f("b", 2)


def test_bad_arguments(tmp_path: Path) -> None:
    with Context(tmp_path) as ctx:
        with pytest.raises(ValueError, match="label"):
            ctx.latest_version("../x")
        with pytest.raises(ValueError, match="i must"):
            ctx.checkpoint("x", -1, lambda: None)
        with pytest.raises(ValueError, match="array"):
            ctx.register("x", [1, 2])  # type: ignore[arg-type]


# ------------------------------------------------------------------ real crashes


def _worker(directory: Path, kind: str, kill_at: int, out: Path) -> int:
    args = [sys.executable, str(WORKER), str(directory), kind, "200", str(kill_at), str(out)]
    return subprocess.run(args, env=python_env(), timeout=120, check=False).returncode


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sigkill_restart_matches_uninterrupted_run(tmp_path: Path, kind: str) -> None:
    kill_at = random.Random(f"resilience-{kind}").randrange(15, 195)
    assert _worker(tmp_path / "ref", kind, -1, tmp_path / "ref.npz") == 0
    assert _worker(tmp_path / "run", kind, kill_at, tmp_path / "crashed.npz") == -9
    assert not (tmp_path / "crashed.npz").exists()
    assert read_checkpoint(tmp_path / "run" / "heat")[0] < kill_at
    assert _worker(tmp_path / "run", kind, -1, tmp_path / "resumed.npz") == 0
    reference, resumed = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "resumed.npz")
    for name in ("u", "v", "t"):
        assert reference[name].tobytes() == resumed[name].tobytes(), name


@pytest.mark.slow
def test_a_loop_stage_resumes_after_its_parsl_worker_is_killed(tmp_path, monkeypatch) -> None:
    import os

    import parsl

    from resilient_flows.apps import loop_app
    from resilient_flows.sites import load_site

    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(tests)
    import loop_stage

    marker = tmp_path / "killed-once"
    params = {"steps": 120, "kill_at": 73, "marker": str(marker)}
    with parsl.load(load_site("local", run_dir=str(tmp_path / "parsl"), retries=1)):
        digest = loop_app("loop_stage:heat", str(tmp_path / "ckpt"), params).result(timeout=240)
    assert marker.exists()  # the first attempt really died at iteration 73
    with Context(tmp_path / "reference", filter=every(10)) as ctx:
        assert digest == loop_stage.heat(ctx, steps=120)
