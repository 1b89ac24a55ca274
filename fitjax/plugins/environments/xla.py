"""`XLAEnvironment`: a Cloud TPU pod slice, one process per TPU VM host."""

from __future__ import annotations

import functools
import glob
import os
import time
import urllib.error
import urllib.request

from fitjax.plugins.environments._base import ClusterEnvironment, env_int

__all__ = ["XLAEnvironment"]

COORDINATOR_PORT = 8482  # JAX's port for TPU pods (its cloud TPU cluster: clusters/cloud_tpu_cluster.py)
_GOOGLE_PCI_VENDOR = "0x1ae0"


def _on_cloud_tpu_vm() -> bool:
    """A Google PCI device (the TPU chips) is present: a Cloud TPU VM. Cheap: no network."""
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


@functools.lru_cache(maxsize=None)
def metadata(key: str) -> str | None:
    """A TPU VM's instance attribute from the GCE metadata server (`GCE_METADATA_IP` overrides its
    address); None when the server does not have it. One request per key per process."""
    host = os.environ.get("GCE_METADATA_IP", "metadata.google.internal")
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/attributes/{key}",
                                     headers={"Metadata-Flavor": "Google"})
    for attempt in range(6):
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
        except OSError:
            pass
        time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"the GCE metadata server at {host} did not answer for {key!r} (6 tries); on a "
                       "TPU VM it always runs: check the VM's network, or set TPU_WORKER_ID and "
                       "TPU_WORKER_HOSTNAMES yourself")


def _worker_hosts(endpoints: str) -> list[str]:
    """Hosts of `worker-network-endpoints`: plain names, or `name:id:ip` triples (older VMs)."""
    hosts = []
    for entry in filter(None, (e.strip() for e in endpoints.split(","))):
        parts = entry.split(":")
        hosts.append(parts[2] if len(parts) == 3 else parts[0])
    return hosts


class XLAEnvironment(ClusterEnvironment):
    """A Cloud TPU pod slice (or several: Multislice), one process per host.

    On GKE the TPU webhook sets `TPU_WORKER_ID` and `TPU_WORKER_HOSTNAMES` (or
    `TPU_PROCESS_ADDRESSES`); on a TPU VM the same facts are the metadata attributes
    `agent-worker-number` and `worker-network-endpoints` (read only when the variables are
    absent). Multislice adds `MEGASCALE_NUM_SLICES`, `MEGASCALE_SLICE_ID` and
    `MEGASCALE_COORDINATOR_ADDRESS`. The coordinator is worker 0 (or Megascale's) on port 8482,
    as JAX does; each process drives all of its host's chips.

    Example:
        >>> # shell: gcloud compute tpus tpu-vm ssh NAME --worker=all --command="python train.py"
    """

    variables = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_NUM_SLICES",
                 "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS", "TPU_SKIP_MDS_QUERY")

    @staticmethod
    def detect() -> bool:
        if "TPU_WORKER_ID" in os.environ and ("TPU_WORKER_HOSTNAMES" in os.environ
                                             or "TPU_PROCESS_ADDRESSES" in os.environ):
            return True
        return "TPU_SKIP_MDS_QUERY" not in os.environ and _on_cloud_tpu_vm()

    def _value(self, name: str, attribute: str) -> str | None:
        if name in os.environ:
            return os.environ[name]
        if "TPU_SKIP_MDS_QUERY" in os.environ:
            return None
        return metadata(attribute)

    def hosts(self) -> list[str]:
        """The slice's hosts in worker order."""
        names = os.environ.get("TPU_PROCESS_ADDRESSES") or os.environ.get("TPU_WORKER_HOSTNAMES")
        if names is None and "TPU_SKIP_MDS_QUERY" not in os.environ:
            names = metadata("worker-network-endpoints")
        return _worker_hosts(names or "") or ["127.0.0.1"]

    def _slices(self) -> tuple[int, int]:
        return env_int("MEGASCALE_NUM_SLICES") or 1, env_int("MEGASCALE_SLICE_ID") or 0

    @property
    def main_address(self) -> str:
        megascale = os.environ.get("MEGASCALE_COORDINATOR_ADDRESS")
        return (megascale or self.hosts()[0]).split(":")[0]

    @property
    def main_port(self) -> int:
        return COORDINATOR_PORT

    def world_size(self) -> int:
        return len(self.hosts()) * self._slices()[0]

    def global_rank(self) -> int:
        worker = self._value("TPU_WORKER_ID", "agent-worker-number")
        in_slice = int(worker) if worker not in (None, "") else 0
        return in_slice + self._slices()[1] * len(self.hosts())

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()
