"""What goes wrong with client hosts, in Ray's words and ours."""

from __future__ import annotations


def actor_lost() -> tuple[type[Exception], ...]:
    """Ray's errors for an actor that died or cannot be reached."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return (RayActorError, ActorDiedError, ActorUnavailableError)


class HostStateLost(RuntimeError):
    """A restarted host was asked for what it no longer holds: its clients' data (until
    the coordinator attaches it again) or its models (engine.rounds: resident)."""


class HostsLost(RuntimeError):
    """Hosts died and ``engine.on_failure`` is ``drop``: their clients leave the run."""

    def __init__(self, clients: list[int]):
        super().__init__(f"client hosts died; clients {clients} leave the run")
        self.clients = clients

    def __reduce__(self):  # crosses process boundaries through Ray: rebuilt from clients
        return (type(self), (self.clients,))
