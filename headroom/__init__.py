"""headroom: spend idle, reclaimable inference capacity on optional ranking work.

The command line, configuration shared by every component (scenarios, Kafka settings) and
logging live in this package; the domain code lives in the top-level packages ``streams``,
``controllers``, ``workers``, ``sim`` and ``analysis`` (see docs/architecture.md).
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
