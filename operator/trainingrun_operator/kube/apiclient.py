"""Every Kubernetes API call the operator makes, in one place. Called only by `handlers.py`.

The official `kubernetes` client is synchronous; each call runs in a worker thread of the Api's own pool
(`API_THREADS`, with as many pooled connections) so the kopf event loop never blocks. The pool is our own, not
the loop's default (cpu_count + 4 threads: 6 on a 2-core node), because a reconcile issues its reads
concurrently and a node event wakes every run at once. Errors are mapped to the operator's vocabulary
(`errors.ApiError`, with the HTTP status) here and nowhere else.

The run's RayJobs and pods are listed from the API server's watch cache (`resourceVersion=0`), as a watch
would deliver them, without the consistent read's wait for the cache to catch up with etcd (most of a pass's
time at 200 runs). What that view can miss is only what changed in the last moments: an object deleted
shows up a little longer (the next attempt waits a little longer), and a pod created in that instant is one
that KubeRay made for a RayJob already being deleted (it never runs a driver). The TrainingRun itself is
read from etcd: its status is what every decision builds on. The lists select by the run's label; what of them
is the run's is the reconciler's to decide, by owner references (`observation.run_rayjobs`, `observation.of_run`).
A create that finds its object there already (409) returns False; the caller reads that object and adopts it
only if it is the run's own (`identity.refusal`); the run's NetworkPolicy it then sets back to what the operator
writes, if it says otherwise (`patch_network_policy_spec`). What the operator may call is exactly what the chart's
ClusterRole grants (charts/trainingrun/templates/clusterrole.yaml); a new call here needs a rule there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml
from kubernetes.client.exceptions import ApiException

from trainingrun_operator.core import errors, events, model, naming
from trainingrun_runtime import timestamps

__all__ = ["Api", "load_configuration"]

logger = logging.getLogger(__name__)

RAY_GROUP, RAY_VERSION, RAYJOBS = "ray.io", "v1", "rayjobs"
API_THREADS = 16
"""Concurrent API calls (threads, and pooled HTTPS connections: a call beyond the pool would open, and then
discard, a connection of its own)."""


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> kubernetes.client.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config).

    errors.InvalidInput, naming the file, when no credentials can be loaded.
    """
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except kubernetes.config.ConfigException:
            pass
    source = _kubeconfig_source(kubeconfig)
    if kubeconfig is not None and not os.path.lexists(kubeconfig):
        raise errors.InvalidInput(f"{source}: no such file")
    try:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise errors.InvalidInput.in_yaml(getattr(mark, "name", None) or source, exc) from exc
    except OSError as exc:
        raise errors.InvalidInput(f"{source}: cannot read it: {exc.strerror or exc}") from exc
    except kubernetes.config.ConfigException as exc:
        if "No configuration found" in str(exc) and kubeconfig is None:
            raise errors.InvalidInput(
                f"no Kubernetes credentials: not in a pod, and no kubeconfig at {source}; "
                "pass --kubeconfig FILE or point KUBECONFIG at one"
            ) from exc
        raise errors.InvalidInput(f"{source}: {exc}") from exc
    return configuration


def _kubeconfig_source(kubeconfig: str | None) -> str:
    """How the kubeconfig was named, for a message: the option, the environment variable, or the default path."""
    if kubeconfig is not None:
        return f"--kubeconfig {kubeconfig}"
    if os.environ.get("KUBECONFIG"):
        return f"KUBECONFIG={os.environ['KUBECONFIG']}"
    return "~/.kube/config"


def _status(exc: ApiException) -> int:
    return int(exc.status or 0)


class Api:
    """The operator's API calls. One instance per operator process (shared by all handlers)."""

    def __init__(self, configuration: kubernetes.client.Configuration, threads: int = API_THREADS) -> None:
        self.configuration = configuration
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, threads)
        self._executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="api")
        self._client = kubernetes.client.ApiClient(configuration)
        self._custom = kubernetes.client.CustomObjectsApi(self._client)
        self._core = kubernetes.client.CoreV1Api(self._client)
        self._rbac = kubernetes.client.RbacAuthorizationV1Api(self._client)
        self._networking = kubernetes.client.NetworkingV1Api(self._client)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one client call in a worker thread; the JSON body as plain dicts (None if empty).

        `_preload_content=False` skips the client's typed models: the operator reads raw dicts anyway, and
        building and re-serialising the models was most of its CPU per reconcile.
        """
        call = functools.partial(fn, *args, _preload_content=False, **kwargs)
        try:
            response = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except ApiException as exc:
            raise errors.ApiError(f"{what}: {exc.status} {exc.reason}: {exc.body!s:.300}", _status(exc)) from exc
        except (OSError, TimeoutError) as exc:  # connection refused, reset, timeouts
            raise errors.ApiError(f"{what}: {exc}") from exc
        data = response.data
        return json.loads(data) if data else None

    # --------------------------------------------------------------------------------- TrainingRuns

    async def _read(self, what: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """One object, or None if it is gone (404)."""
        try:
            obj = await self._call(what, fn, *args)
        except errors.ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    async def get_trainingrun(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The TrainingRun, or None if it is gone."""
        return await self._read(
            f"get trainingrun {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            model.GROUP,
            model.VERSION,
            namespace,
            model.PLURAL,
            name,
        )

    async def patch_trainingrun_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """JSON merge patch on the status subresource (operator-owned fields only; never status.runtime)."""
        await self._call(
            f"patch trainingrun {namespace}/{name} status",
            self._custom.patch_namespaced_custom_object_status,
            model.GROUP,
            model.VERSION,
            namespace,
            model.PLURAL,
            name,
            {"status": dict(patch)},
            _content_type="application/merge-patch+json",
        )

    # ------------------------------------------------------------------------------------ RayJobs

    async def list_rayjobs(self, namespace: str, run: str) -> list[dict[str, Any]]:
        """Every RayJob with `run`'s label, any attempt (the run's own are those it owns: `observation.run_rayjobs`)."""
        result = await self._call(
            f"list rayjobs of {namespace}/{run}",
            self._custom.list_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            RAYJOBS,
            label_selector=f"{naming.LABEL_RUN}={run}",
            resource_version="0",
        )
        return list(result.get("items", []))

    async def create_rayjob(self, body: Mapping[str, Any]) -> bool:
        """Create a RayJob; False if one exists under its name (409: adopted if it is the run's, never a duplicate)."""
        meta = body["metadata"]
        return await self._create(
            f"create rayjob {meta['namespace']}/{meta['name']}",
            self._custom.create_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            meta["namespace"],
            RAYJOBS,
            dict(body),
        )

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A RayJob, or None if it is gone."""
        return await self._read(
            f"get rayjob {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            RAYJOBS,
            name,
        )

    async def delete_rayjob(self, namespace: str, name: str) -> bool:
        """Delete a RayJob and (in the background) its Ray cluster and pods; False if already gone."""
        try:
            await self._call(
                f"delete rayjob {namespace}/{name}",
                self._custom.delete_namespaced_custom_object,
                RAY_GROUP,
                RAY_VERSION,
                namespace,
                RAYJOBS,
                name,
                propagation_policy="Background",
            )
        except errors.ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # ---------------------------------------------------------------------------- pods and nodes

    async def list_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        """Every pod with `run`'s label (the RayJob pod templates carry it; the run's own: `observation.of_run`)."""
        result = await self._call(
            f"list pods of {namespace}/{run}",
            self._core.list_namespaced_pod,
            namespace,
            label_selector=f"{naming.LABEL_RUN}={run}",
            resource_version="0",
        )
        return list(result.get("items", []))

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """A node, or None if it is gone."""
        return await self._read(f"get node {name}", self._core.read_node, name)

    # --------------------------------------------------------------------------- driver identity

    async def create_service_account(self, body: Mapping[str, Any]) -> bool:
        """Create the driver's ServiceAccount; False if one exists under its name (409)."""
        meta = body["metadata"]
        return await self._create(
            f"create serviceaccount {meta['namespace']}/{meta['name']}",
            self._core.create_namespaced_service_account,
            meta["namespace"],
            dict(body),
        )

    async def create_role(self, body: Mapping[str, Any]) -> bool:
        """Create the driver's Role; False if one exists under its name (409)."""
        meta = body["metadata"]
        return await self._create(
            f"create role {meta['namespace']}/{meta['name']}",
            self._rbac.create_namespaced_role,
            meta["namespace"],
            dict(body),
        )

    async def create_role_binding(self, body: Mapping[str, Any]) -> bool:
        """Create the driver's RoleBinding; False if one exists under its name (409)."""
        meta = body["metadata"]
        return await self._create(
            f"create rolebinding {meta['namespace']}/{meta['name']}",
            self._rbac.create_namespaced_role_binding,
            meta["namespace"],
            dict(body),
        )

    async def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ServiceAccount, or None if it is gone (read after a 409, to see whose it is)."""
        return await self._read(
            f"get serviceaccount {namespace}/{name}", self._core.read_namespaced_service_account, name, namespace
        )

    async def get_role(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Role, or None if it is gone (read after a 409, to see whose it is and what it grants)."""
        return await self._read(f"get role {namespace}/{name}", self._rbac.read_namespaced_role, name, namespace)

    async def get_role_binding(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A RoleBinding, or None if it is gone (read after a 409, to see whose it is and what it binds)."""
        return await self._read(
            f"get rolebinding {namespace}/{name}", self._rbac.read_namespaced_role_binding, name, namespace
        )

    # ---------------------------------------------------------------------------- network policy

    async def create_network_policy(self, body: Mapping[str, Any]) -> bool:
        """Create the run's NetworkPolicy; False if one exists under its name (409)."""
        meta = body["metadata"]
        return await self._create(
            f"create networkpolicy {meta['namespace']}/{meta['name']}",
            self._networking.create_namespaced_network_policy,
            meta["namespace"],
            dict(body),
        )

    async def get_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A NetworkPolicy, or None if it is gone (read after a 409, to see whose it is and what it admits)."""
        return await self._read(
            f"get networkpolicy {namespace}/{name}", self._networking.read_namespaced_network_policy, name, namespace
        )

    async def patch_network_policy_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        """Replace a NetworkPolicy's whole spec (a JSON patch; a merge patch would keep selector keys it omits)."""
        await self._call(
            f"patch networkpolicy {namespace}/{name}",
            self._networking.patch_namespaced_network_policy,
            name,
            namespace,
            [{"op": "replace", "path": "/spec", "value": dict(spec)}],
            _content_type="application/json-patch+json",
        )

    async def _create(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            await self._call(what, fn, *args)
        except errors.ApiError as exc:
            if exc.status == 409:
                logger.debug("%s: exists", what)
                return False
            raise
        return True

    # ------------------------------------------------------------------------------------ events

    async def post_event(self, run: Mapping[str, Any], type_: events.Type, reason: events.Reason, message: str) -> None:
        """A core/v1 Event on the TrainingRun (what `kubectl describe trun` shows); `events.py` has every reason."""
        meta = run["metadata"]
        now = timestamps.now(timespec="seconds")  # what the API server keeps of an event's time
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": model.API_VERSION,
                "kind": model.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_.value,
            "reason": reason.value,
            "message": message[:1024],
            "source": {"component": naming.MANAGED_BY},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": naming.MANAGED_BY,
        }
        await self._call(
            f"post event {reason.value} on {meta['namespace']}/{meta['name']}",
            self._core.create_namespaced_event,
            meta["namespace"],
            body,
        )
