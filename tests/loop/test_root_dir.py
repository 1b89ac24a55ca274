"""`Trainer(default_root_dir=...)`: its check holds across the processes of a run."""

from __future__ import annotations

import threading

import fitjax as fj


def test_the_processes_of_a_run_checking_one_new_root_dir_at_once_all_pass(tmp_path):
    """Every process of a launched run builds its `Trainer` with the same `default_root_dir` at
    the same moment. The check of a missing folder must not trip over another process's check
    (a run under `fitjax launch --max-restarts` once failed on rank 1 with "... is a file"):
    here four threads build trainers on one new folder 150 times each."""
    root, failures, start = tmp_path / "runs" / "logs", [], threading.Barrier(4)

    def build():
        start.wait()
        for _ in range(150):
            try:
                fj.Trainer(default_root_dir=root, logger=False, enable_progress_bar=False)
            except ValueError as err:
                failures.append(str(err))

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert list(tmp_path.iterdir()) == []  # the check leaves nothing behind
