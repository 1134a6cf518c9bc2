"""headroom: spend idle, reclaimable inference capacity on optional ranking work.

Everything imports as ``headroom.…``, in layers that import one way (docs/architecture.md):
``kernel`` (errors, settings, the scenario model, the sketch, the codec), ``world`` (the ranking
world and its curves), ``defences`` (the local defences' pure cores), ``controllers``, ``streams``
(Kafka plumbing), ``analysis``, the engines ``workers`` and ``sim``, and on top the command line
(``cli`` and ``commands``) and ``bench``.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
