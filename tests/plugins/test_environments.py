"""Cluster environments read what each launcher sets.

The variables of SLURM (`srun -n 2`, an `sbatch` script), torchrun and Open MPI were printed by
real runs on this machine (`env` inside the fixture cluster of tests/clusters, `torchrun
--nproc_per_node 2`, `mpirun -np 2`, each printing its environment); the others come from each
system's documentation, named at each case. Lightning's names and rules:
lightning/fabric/plugins/environments/{slurm,torchelastic,kubeflow,lightning}.py.
"""

from __future__ import annotations

import http.server
import os
import re
import signal
import socket
import threading

import jax
import pytest

import fitjax as fj
from fitjax.plugins import environments as envs
from fitjax.plugins.environments import xla
from fitjax.strategies import initialize_distributed

_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "TPU_", "MEGASCALE_", "SKYPILOT_", "JAX_",
             "TORCHELASTIC_", "GCE_METADATA", "FITJAX_RAY_")
_NAMES = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK",
          "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "KUBERNETES_PORT"}


@pytest.fixture
def launched(monkeypatch):
    """Clears every launcher's variables, then sets those of one launch."""
    for name in list(os.environ):
        if name.startswith(_PREFIXES) or name in _NAMES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")  # no metadata server here (cleared again by XLA tests)

    def set_vars(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
    return set_vars


def numbers(env):
    return (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank(), env.num_nodes(),
            env.local_world_size(), env.coordinator_address(), env.local_device_ids())


# `srun -n 2 env` in the fixture cluster (task 1 of 2 on node "vm", job 2)
SRUN_TASK_1 = {"SLURM_JOB_ID": "2", "SLURM_JOBID": "2", "SLURM_JOB_NAME": "env", "SLURM_STEP_ID": "0",
               "SLURM_STEPID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_STEP_NUM_TASKS": "2",
               "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
               "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2",
               "SLURM_TASKS_PER_NODE": "2", "SLURM_NODELIST": "vm", "SLURM_STEP_NODELIST": "vm",
               "SLURM_JOB_NODELIST": "vm", "SLURM_GTIDS": "0,1"}
# the same job's batch script (`sbatch -n 2`): no job step variables
SBATCH_SCRIPT = {"SLURM_JOB_ID": "3", "SLURM_JOB_NAME": "job.sh", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
                 "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
                 "SLURM_TASKS_PER_NODE": "2", "SLURM_NODELIST": "vm", "SLURM_JOB_NODELIST": "vm"}
# `srun` on 2 nodes x 4 tasks, task 5 (srun(1) "OUTPUT ENVIRONMENT VARIABLES"; host list syntax of
# scontrol(1) "show hostnames")
SRUN_TWO_NODES = {"SLURM_JOB_ID": "123456", "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0",
                  "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
                  "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
                  "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "gpu[003-004]",
                  "SLURM_NODELIST": "gpu[003-004]"}
# `NODE_RANK=0 torchrun --nproc_per_node 2 script.py`, process 1 (printed by the script)
TORCHRUN_1 = {"RANK": "1", "GROUP_RANK": "0", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2",
              "MASTER_ADDR": "localhost", "MASTER_PORT": "42377", "GROUP_WORLD_SIZE": "1",
              "ROLE_WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True", "NODE_RANK": "0",
              "TORCHELASTIC_RESTART_COUNT": "0"}
# `mpirun -np 2` (Open MPI 4.1.4), rank 1
MPIRUN_1 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1",
            "OMPI_MCA_orte_hnp_uri": "28311552.0;tcp://192.0.2.2:43355;tcp6://[fd00::2]:39949",
            "PMIX_SERVER_URI41": "28311552.0;tcp4://127.0.0.1:55329"}


def test_nothing_launched_is_one_lightning_process(launched):
    env = envs.detect()
    assert type(env) is envs.LightningEnvironment
    assert numbers(env)[:6] == (1, 0, 0, 0, 1, 1)


def test_srun_task_is_a_slurm_process_with_its_rank_and_local_device(launched):
    launched(SRUN_TASK_1)
    env = envs.detect()
    assert type(env) is envs.SLURMEnvironment
    # coordinator: the first host, port 15000 + the job id's last 4 digits (Lightning's main_port)
    assert numbers(env) == (2, 1, 1, 0, 1, 2, "vm:15002", [1])
    assert env.job_id() == 2 and env.auto_requeue and env.requeue_signal == signal.SIGUSR1


def test_srun_on_two_nodes_counts_machines_and_finds_the_first_host(launched):
    launched(SRUN_TWO_NODES)
    env = envs.detect()
    assert numbers(env) == (8, 5, 1, 1, 2, 4, "gpu003:18456", [1])
    env.validate_settings("auto", 2)
    with pytest.raises(ValueError, match=re.escape("Trainer(num_nodes=16) but SLURMEnvironment runs 8 processes "
                                                   "on 2 nodes (")) as info:
        env.validate_settings("auto", 16)  # Lightning's recipe counts machines, not processes
    assert "SLURM_NNODES='2'" in str(info.value) and "pass num_nodes=2" in str(info.value)
    launched({"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"})  # Lightning's overrides
    assert env.coordinator_address() == "10.1.1.1:1234"


@pytest.mark.parametrize(("nodelist", "first"), [
    ("vm", "vm"), ("node001,host2", "node001"), ("gpu[003-004,9],cpu1", "gpu003"), ("a[7,9-10]", "a7")])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert envs.slurm.first_host(nodelist) == first


def test_tasks_per_node_of_slurms_compressed_counts():
    assert [envs.slurm.tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="cannot read the SLURM task counts 'x'"):
        envs.slurm.tasks_on_node("x", 0)


@pytest.mark.parametrize("script", [SBATCH_SCRIPT, {**SBATCH_SCRIPT, "SLURM_JOB_NAME": "interactive"}],
                         ids=["sbatch", "salloc"])
def test_a_batch_script_or_salloc_shell_without_srun_is_one_process_with_a_warning(launched, script):
    launched(script)
    env = envs.detect()
    assert type(env) is envs.SLURMEnvironment and numbers(env)[:6] == (1, 0, 0, 0, 1, 1)
    with pytest.warns(UserWarning, match=r"has 2 tasks \(SLURM_NTASKS=2\), but this process was not started by "
                                         r"srun .* runs alone: 1 process.*`srun python train.py \.\.\.`"):
        assert initialize_distributed(plugins=None) is not None  # one process: nothing to start


def test_fitjax_launch_inside_a_batch_script_is_fitjax_launch(launched):
    launched({**SBATCH_SCRIPT, "JAX_COORDINATOR_ADDRESS": "127.0.0.1:5000", "JAX_NUM_PROCESSES": "2",
              "JAX_PROCESS_ID": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    env = envs.detect()
    assert type(env) is envs.LightningEnvironment
    assert numbers(env) == (2, 1, 1, 0, 1, 2, "127.0.0.1:5000", [1])


def test_torchrun_with_node_rank_exported_uses_rank_and_local_rank(launched):
    launched(TORCHRUN_1)
    env = envs.detect()
    assert type(env) is envs.TorchElasticEnvironment
    # rank 1 (not NODE_RANK's 0), one device per process; the agent's store holds MASTER_PORT
    assert numbers(env) == (2, 1, 1, 0, 1, 2, "localhost:42378", [1])


def test_a_coordinator_port_in_use_is_named_before_jax_would_crash_on_it(launched):
    """Process 0 starts JAX's coordinator on MASTER_PORT + 1 under torchrun's agent store; JAX
    dies of a segmentation fault when that port is taken (seen when another program held it):
    fitjax says which port and which variable to change, before starting anything."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        launched({**TORCHRUN_1, "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(taken - 1)})
        with pytest.raises(RuntimeError, match=rf"coordinator cannot listen on port {taken} of this machine "
                                               rf"\(process 0 starts it, at '127.0.0.1:{taken}'\).*"
                                               r"MASTER_PORT='\d+'.*choose a free port for every process"):
            initialize_distributed()
    assert not jax.distributed.is_initialized()


def test_slurm_comes_before_torchelastic_as_in_lightning(launched):
    launched({**SRUN_TASK_1, **TORCHRUN_1})
    assert type(envs.detect()) is envs.SLURMEnvironment


def test_kubeflow_pytorchjob_is_one_process_per_pod(launched):
    # Kubeflow training-operator, pkg/controller.v1/pytorch/envvar.go: MASTER_ADDR/PORT, WORLD_SIZE, RANK
    launched({"KUBERNETES_PORT": "tcp://10.96.0.1:443", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
              "WORLD_SIZE": "3", "RANK": "2"})
    env = envs.detect()
    assert type(env) is envs.KubeflowEnvironment
    assert numbers(env) == (3, 2, 0, 2, 3, 1, "job-master-0:23456", None)


def test_open_mpi_ranks_and_the_coordinator_from_the_launcher_uri(launched):
    launched(MPIRUN_1)
    env = envs.detect()
    assert type(env) is envs.MPIEnvironment
    # JAX's ompi_cluster rule: the launcher's IP, port 28311552 // 2**12 % 2**12 + 61440
    assert numbers(env) == (2, 1, 1, 0, 1, 2, "192.0.2.2:64256", [1])
    launched({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert env.coordinator_address() == "127.0.0.1:29500"


def test_mpich_ranks_without_a_coordinator_are_refused_with_the_fix(launched):
    # MPICH's Hydra (and Intel MPI) set PMI_SIZE, PMI_RANK, MPI_LOCALRANKID, MPI_LOCALNRANKS
    launched({"PMI_SIZE": "4", "PMI_RANK": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    env = envs.detect()
    assert type(env) is envs.MPIEnvironment and numbers(env) == (4, 3, 1, 1, 2, 2, None, [1])
    with pytest.raises(ValueError, match=r"MPIEnvironment describes 4 processes but no coordinator \(.*PMI_SIZE='4'"
                                         r".*\): set JAX_COORDINATOR_ADDRESS=host:port, or MASTER_ADDR and MASTER_PORT"):
        initialize_distributed()


def test_skypilot_nodes(launched):
    # SkyPilot docs, "Environment variables": SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (head first), SKYPILOT_NUM_NODES
    launched({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2\n", "SKYPILOT_NUM_NODES": "2",
              "SKYPILOT_NUM_GPUS_PER_NODE": "8"})
    env = envs.detect()
    assert type(env) is envs.SkyPilotEnvironment and numbers(env) == (2, 1, 0, 1, 2, 1, "10.0.0.1:8476", None)


def test_tpu_pod_on_gke(launched, monkeypatch):
    # GKE's TPU webhook sets TPU_WORKER_ID and TPU_WORKER_HOSTNAMES (JAX: clusters/cloud_tpu_cluster.py)
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY")
    launched({"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "job-0.svc,job-1.svc,job-2.svc,job-3.svc"})
    env = envs.detect()
    assert type(env) is envs.XLAEnvironment and numbers(env) == (4, 1, 0, 1, 4, 1, "job-0.svc:8482", None)
    # Multislice: 2 slices of 4 hosts, this host the second of slice 1; Megascale's coordinator
    launched({"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1", "MEGASCALE_COORDINATOR_ADDRESS": "job-0.svc:8080"})
    assert numbers(env)[:2] == (8, 5) and env.coordinator_address() == "job-0.svc:8482"


class _Metadata(http.server.BaseHTTPRequestHandler):
    # a TPU VM's metadata attributes (older `name:id:ip` endpoint format), as JAX reads them
    ATTRIBUTES = {"agent-worker-number": "1", "worker-network-endpoints": "unknown:0:10.130.0.2,unknown:1:10.130.0.3"}

    def do_GET(self):
        key = self.path.rsplit("/", 1)[-1]
        ok = self.headers.get("Metadata-Flavor") == "Google" and key in self.ATTRIBUTES
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(self.ATTRIBUTES[key].encode() if ok else b"")

    def log_message(self, *args):
        pass


def test_tpu_vm_reads_the_metadata_server(launched, monkeypatch):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY")
    launched({"GCE_METADATA_IP": f"127.0.0.1:{server.server_port}"})
    xla.metadata.cache_clear()
    try:
        env = envs.XLAEnvironment()
        assert numbers(env) == (2, 1, 0, 1, 2, 1, "10.130.0.2:8482", None)
        assert xla.metadata("no-such-key") is None
    finally:
        server.shutdown()
        xla.metadata.cache_clear()


def test_lightning_variables_rank_before_node_rank(launched):
    launched({"MASTER_ADDR": "host0", "MASTER_PORT": "1234", "WORLD_SIZE": "4", "RANK": "3", "NODE_RANK": "1",
              "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    env = envs.LightningEnvironment()
    assert numbers(env) == (4, 3, 1, 1, 2, 2, "host0:1234", [1])


def test_plugins_name_the_environment_and_reject_anything_else(launched):
    launched(SRUN_TASK_1)
    env = envs.LightningEnvironment()
    assert envs.from_plugins([env]) is env and envs.from_plugins(env) is env
    assert type(envs.from_plugins(None)) is envs.SLURMEnvironment
    with pytest.raises(ValueError, match=r"Trainer\(plugins=\.\.\.\) got 'bf16'; fitjax takes cluster environments"):
        envs.from_plugins(["bf16"])
    with pytest.raises(ValueError, match="got 2 cluster environments"):
        envs.from_plugins([env, envs.SLURMEnvironment()])


def test_trainer_takes_the_named_environment(launched):
    trainer = fj.Trainer(plugins=[envs.SLURMEnvironment(auto_requeue=False)], logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    assert type(trainer.cluster_environment) is envs.SLURMEnvironment
    assert trainer.cluster_environment.auto_requeue is False


def test_num_nodes_without_a_coordinator_is_refused(launched):
    with pytest.raises(ValueError, match=r"LightningEnvironment describes 2 processes but no coordinator"):
        fj.Trainer(num_nodes=2)
    with pytest.raises(ValueError, match=r"num_nodes=\.\.\.\) must be a positive int \(machines\).*got 0"):
        fj.Trainer(num_nodes=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"heartbeat_timeout": 0}, r"SLURMEnvironment\(heartbeat_timeout=\.\.\.\) must be a positive int of seconds, got 0"),
    ({"requeue_signal": "USR1"}, r"requeue_signal=\.\.\.\) must be a signal\.Signals such as signal\.SIGUSR1, got 'USR1'"),
    ({"auto_requeue": 1}, r"auto_requeue=\.\.\.\) must be True or False, got 1"),
])
def test_bad_environment_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        envs.SLURMEnvironment(**kwargs)


def test_timeouts_are_what_jax_distributed_gets():
    env = envs.TorchElasticEnvironment(initialization_timeout=60, heartbeat_timeout=20)
    assert env.timeouts == {"initialization_timeout": 60, "heartbeat_timeout_seconds": 20,
                            "shutdown_timeout_seconds": 300}


def test_a_bad_variable_is_named(launched):
    launched({**SRUN_TASK_1, "SLURM_PROCID": "one"})
    with pytest.raises(ValueError, match=r"SLURM_PROCID='one' must be an integer"):
        envs.detect().global_rank()


def test_a_ray_worker_reads_what_fitjax_integrations_ray_set(launched):
    # fitjax.integrations.ray.setup_worker copies ray.train.get_context()'s ranks and rank 0's address
    launched({**SRUN_TASK_1, "FITJAX_RAY_COORDINATOR": "10.0.0.5:40123", "FITJAX_RAY_WORLD_SIZE": "4",
              "FITJAX_RAY_WORLD_RANK": "3", "FITJAX_RAY_LOCAL_RANK": "1", "FITJAX_RAY_LOCAL_WORLD_SIZE": "2",
              "FITJAX_RAY_NODE_RANK": "1"})
    env = envs.detect()  # before SLURM's: Ray's workers inside a SLURM job are still Ray's
    assert type(env) is envs.RayEnvironment and numbers(env) == (4, 3, 1, 1, 2, 2, "10.0.0.5:40123", [1])
