"""The raw Kubernetes REST client: config, verbs, typed errors, watch, informer, work queue, leader election.

It knows nothing about GPUs."""

from gpuremediate.kube import errors, resources
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, load_config
from gpuremediate.kube.leader import LeaderElector
from gpuremediate.kube.resources import Resource
from gpuremediate.kube.watch import WatchEvent
from gpuremediate.kube.workqueue import WorkQueue

__all__ = [
    "ClusterConfig", "Informer", "KubeClient", "LeaderElector", "Resource", "WatchEvent", "WorkQueue",
    "errors", "load_config", "resources",
]
