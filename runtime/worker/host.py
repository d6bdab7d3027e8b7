"""What one Worker process holds once set up: its tensor exchange, its model part, its Worker.

A tensor-parallel rank k > 0 also runs a TPFollower for the group's AR module, on a
thread of its own (it waits inside collectives between steps), while a Worker for
any other nodes placed on the same rank runs on the device thread as usual.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.device_loop import run_on_device
from mstar.transport.exchange import TensorExchange
from mstar.worker import registry
from mstar.worker.model_spec import build_model
from mstar.worker.protocol import Setup
from mstar.worker.worker import Worker

log = logging.getLogger("mstar.worker")


class WorkerHost:
    def __init__(self, setup: Setup, rank: int, tag: str, secret: bytes | None = None) -> None:
        # names are looked up first: an unregistered one fails before anything is built or read
        registry.resolve(registry.MODELS, setup.spec.model)
        plugins = [registry.resolve(registry.PLUGINS, name) for name in setup.plugins]
        if setup.threads:
            torch.set_num_threads(setup.threads)  # Workers sharing a host split its cores
        self.rank = rank
        self.exchange = TensorExchange(
            tag,
            shm="shm" in setup.transports,
            tcp_host=setup.host if "tcp" in setup.transports else None,
            mooncake_host=setup.host if "mooncake" in setup.transports else None,
            secret=secret,
        )
        self.tp = None
        self.follower_thread: threading.Thread | None = None
        self.follower_error: BaseException | None = None
        if setup.tp is not None and setup.tp.size > 1:
            from mstar.parallel.group import TPGroup

            self.tp = TPGroup.init(setup.tp.rank, setup.tp.size, setup.tp.init_method, setup.device)
        graph, modules = run_on_device(build_model, setup.spec, set(setup.nodes), self.tp)
        nodes = list(setup.nodes)
        if self.tp is not None and not self.tp.is_leader:
            ar = [n.name for n in graph.nodes if n.name in nodes and n.engine == "ar"]
            self._follow({m: mod for m, mod in modules.items() if isinstance(mod, ARModule)}, setup.device)
            nodes = [n for n in nodes if n not in ar]  # rank 0 of the group serves the AR nodes
        self.worker = run_on_device(
            Worker,
            graph,
            modules,
            self.exchange,
            setup.config,
            setup.device,
            nodes=nodes,
            rank=rank,
            tp=self.tp if self.tp is not None and self.tp.is_leader else None,
            quantization=setup.quantization,
        )
        for engine in self.worker.ar_engines.values():
            engine.on_fatal = self._fatal
        self.worker.start()
        self._plugins = [plugin(self) for plugin in plugins]
        log.info(
            "rank %d serves nodes %s on %s%s",
            rank,
            self.worker.nodes,
            setup.device,
            f" (tensor-parallel rank {self.tp.rank} of {self.tp.size})" if self.tp is not None else "",
        )

    def _follow(self, ar_modules: dict[str, ARModule], device: str) -> None:
        from mstar.engine.tp_follower import TPFollower

        if len(ar_modules) != 1:
            raise ValueError(f"a tensor-parallel rank hosts exactly one AR module, got {sorted(ar_modules)}")
        follower = TPFollower(next(iter(ar_modules.values())), self.tp, device)

        def run() -> None:
            try:
                follower.run()
            except BaseException as exc:  # the leader died: this rank must go too (the pool restarts the group)
                self.follower_error = exc
                log.error("tensor-parallel follower stopped: %s; exiting", exc)
                os._exit(3)

        self.follower_thread = threading.Thread(target=run, name="mstar-tp-follower", daemon=True)
        self.follower_thread.start()

    @staticmethod
    def _fatal(reason: str) -> None:
        """This process cannot serve any more (its tensor-parallel group broke): exit, and the
        Conductor restarts the group. The failed calls' replies were already sent."""
        log.error("exiting: %s", reason)
        os._exit(3)

    @property
    def segment_prefix(self) -> str:
        return self.exchange.prefix

    def close(self) -> None:
        try:
            for plugin in self._plugins:
                if plugin is not None and hasattr(plugin, "close"):
                    try:
                        plugin.close()
                    except Exception:  # a plugin must not keep the shared memory alive
                        log.exception("closing a worker plugin failed")
            self.worker.stop()
        finally:
            self._close_rest()

    def _close_rest(self) -> None:
        if self.follower_thread is not None:
            self.follower_thread.join(timeout=10)
        if self.tp is not None:
            try:
                self.tp.destroy()
            except Exception:
                pass
        self.exchange.close()
