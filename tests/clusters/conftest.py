"""The `slurm` fixture: one real SLURM cluster on localhost for the whole test run."""

from __future__ import annotations

import pytest
from slurm_cluster import SlurmCluster, missing_binaries


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A started `SlurmCluster` (munged, slurmctld, slurmd; one node, this machine's CPUs).

    Started on first use, stopped (jobs cancelled, daemons ended) when the test run ends.
    """
    missing = missing_binaries()
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} not found): "
                    "apt-get install -y slurm-wlm munge (what .ci/run does)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
