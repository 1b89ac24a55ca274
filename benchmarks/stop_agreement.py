"""What agreeing on a stop step costs per step with 2 processes, and how soon after a signal they stop.

    python benchmarks/stop_agreement.py            # 2 launched processes, 1 CPU device each
    python benchmarks/stop_agreement.py --smoke    # no fit (its compile): CI runs this so the script cannot rot

It starts itself under `fitjax launch --nproc 2` (each process one CPU device) and measures, in
each process:

1. a tiny step: the same `fj.Trainer` fit as `benchmarks/checkpoint.py` (MLP 64-64-10, batch 32
   per process, adam), strategy "dp" over the 2 processes, the time per step after the first 20
   (the state waited for at the end);
2. the loop's per-step call `StopAgreement.reached(step)` with its watcher thread running, timed
   over many calls (the budget: under 1% of the tiny step);
3. a stop: a loop of 1 ms steps in which process 1 alone requests a stop at step 200; the step
   each process stops after and the milliseconds from the request to each stop.

Process 0 prints the table; the cost per step is also given for one process (no thread).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _launch(args: argparse.Namespace) -> int:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), ".."), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "fitjax.cli", "launch", "--nproc", "2", "--devices-per-process", "1",
               os.path.abspath(__file__), "--worker", "--steps", str(args.steps), "--calls", str(args.calls)]
    return subprocess.run(command, env=env, timeout=900).returncode


def _worker(args: argparse.Namespace) -> None:
    import jax
    import numpy as np
    from checkpoint import Tiny, _data
    from jax.experimental import multihost_utils

    import fitjax as fj
    from fitjax.strategies._stop_agreement import StopAgreement

    fj.strategies.initialize_distributed()
    rank = jax.process_index()

    class StepClock(fj.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 20:
                jax.block_until_ready(trainer.state)
                self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            jax.block_until_ready(trainer.state)
            self.per_step = (time.perf_counter() - self.start) / (trainer.global_step - 20)

    clock = StepClock()
    clock.per_step = float("nan")
    if args.steps:  # --smoke skips the fit: its compilation is most of a smoke run's time
        data = _data(64 * args.steps)
        trainer = fj.Trainer(max_steps=args.steps, strategy="dp", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
        trainer.fit(Tiny(), fj.DataLoader(data, batch_size=64, drop_last=True))

    agreement = StopAgreement()  # its watcher thread waits on the coordinator meanwhile
    start = time.perf_counter()
    for step in range(args.calls):
        agreement.reached(step)
    per_call = (time.perf_counter() - start) / args.calls
    agreement.close()

    multihost_utils.sync_global_devices("stop run")
    agreement = StopAgreement()
    requested_at = stop_step = None
    for step in range(1, 100_000):
        if rank == 1 and step == 200:
            requested_at = time.perf_counter()
            agreement.request("SIGTERM")
        if agreement.reached(step):
            stop_step, stopped = step, time.perf_counter()
            break
        time.sleep(0.001)
    agreement.close()
    when = np.asarray([stop_step, (stopped - requested_at) * 1e3 if requested_at else 0.0])
    rows = multihost_utils.process_allgather(when)
    if rank == 0:
        print(f"tiny step, 2 processes (dp):          {clock.per_step * 1e3:8.3f} ms")
        print(f"StopAgreement.reached per step:       {per_call * 1e9:8.0f} ns "
              f"({100 * per_call / clock.per_step:.3f}% of the step; budget 1%)")
        print(f"process 1 requests at step 200: both stop after steps {[int(r[0]) for r in rows]}, "
              f"{rows[1][1]:.1f} ms after the request (1 ms steps)")


def _one_process(calls: int) -> float:
    from fitjax.strategies._stop_agreement import StopAgreement

    agreement = StopAgreement()
    start = time.perf_counter()
    for step in range(calls):
        agreement.reached(step)
    agreement.close()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="train steps of the tiny fit (> 20; 0: no fit)")
    parser.add_argument("--calls", type=int, default=1_000_000, help="timed calls of reached()")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: no fit, 10_000 calls")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.calls = 0, 10_000
    if 0 < args.steps <= 20:
        parser.error(f"--steps must be 0 or > 20 (the first 20 are not timed), got {args.steps}")
    if args.worker:
        _worker(args)
        return
    status = _launch(args)
    print(f"StopAgreement.reached, one process:   {_one_process(args.calls) * 1e9:8.0f} ns (no thread)")
    sys.exit(status)


if __name__ == "__main__":
    main()
