"""Entry points that drive a `Trainer` from outside: `fitjax.integrations.ray` (Ray Train).

Each is imported on its own (`import fitjax.integrations.ray`), so fitjax never needs Ray.
"""

__all__: list[str] = []
