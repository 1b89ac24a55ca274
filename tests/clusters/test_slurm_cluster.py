"""The fixture cluster itself: `srun` tasks get SLURM's variables, `sbatch` jobs run and finish."""

from __future__ import annotations


def test_srun_starts_one_task_per_rank_with_slurms_variables(slurm):
    out = slurm.srun("-n", "2", "bash", "-c", "echo task $SLURM_PROCID of $SLURM_NTASKS local $SLURM_LOCALID").stdout
    assert sorted(line for line in out.splitlines() if line.startswith("task")) == [
        "task 0 of 2 local 0", "task 1 of 2 local 1"]


def test_sbatch_runs_the_script_once_and_keeps_its_output(slurm):
    job = slurm.sbatch("#!/bin/bash\n#SBATCH --ntasks=2\necho batch $SLURM_JOB_ID ntasks=$SLURM_NTASKS step=${SLURM_STEP_ID-none}\n")
    info = slurm.wait(job, timeout=60)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    # the batch script is no job step: one process, SLURM_NTASKS says what srun would start
    assert slurm.output(job) == f"batch {job} ntasks=2 step=none\n"


def test_a_requeued_batch_job_runs_again_with_its_restart_count(slurm):
    # what SLURM-aware code relies on: the same job id runs again, SLURM_RESTART_COUNT says which run
    job = slurm.sbatch("#!/bin/bash\necho run ${SLURM_RESTART_COUNT-0}\n"
                       "if [ -z \"$SLURM_RESTART_COUNT\" ]; then scontrol requeue $SLURM_JOB_ID; sleep 60; fi\n")
    info = slurm.wait(job, timeout=90)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    runs = [line for line in slurm.output(job).splitlines() if line.startswith("run")]
    assert runs == ["run 0", "run 1"]
