"""Imports vLLM's own Python sources, unpacked from the wheel, without torch.

vLLM's KV cache manager, block pool, request block hasher, event publisher and
offloading connector are pure Python, but the modules that define them import
torch, transformers and the serving stack at module level. This module:

* puts a permissive stand-in module into ``sys.modules`` for each package in
  ``STUBBED`` (attribute access, calls, subclassing, ``|`` in annotations and
  pydantic schemas all work; a call with one callable argument returns it, so
  stand-ins used as decorators leave the function alone);
* registers the ``vllm`` package without running ``vllm/__init__.py``, whose only
  work is ``vllm.env_override`` (torch and inductor patches, environment
  variables for CUDA and Triton) and lazy attribute exports;
* sets ``VLLM_TARGET_DEVICE=cpu`` so platform detection picks the CPU platform,
  and clears every other ``VLLM_*`` variable so vLLM's defaults apply (vLLM's
  loggers print errors only; CONFORMANCE_VLLM_LOG=INFO shows more);
* removes ``PYTHONHASHSEED`` from ``os.environ`` after the interpreter read it:
  run.sh sets it so that Python's set order (which vLLM's offloading scheduler
  iterates) is the same on every run, and vLLM would otherwise derive its
  NONE_HASH seed from it instead of its default seed.

While ``counting()`` is on, a stand-in that is called or asked for a new
attribute is counted in ``TOUCHES``; the harness counts while it drives the
engines and probes them (not while it imports and builds them) and reports
the count, which stays 0 unless a driven code path reached torch.
"""

import importlib
import importlib.abc
import logging
import importlib.machinery
import os
import sys
import types
from collections import Counter

# Packages vLLM imports at module level on the way to the KV cache code but never
# calls on the paths the harness drives. Everything else it imports is installed
# for real from requirements.txt (msgspec, pyzmq, cbor2, pydantic, numpy, ...).
STUBBED = (
    "torch",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "aiohttp",
    "requests",
    "openai",
    "openai_harmony",
    "cloudpickle",
    "PIL",
    "pybase64",
    "cachetools",
    "uvloop",
    "cpuinfo",
    "prometheus_client",
    "xgrammar",
    "fastapi",
    "partial_json_parser",
    "llguidance",
)

# torch's version as pinned by the wheel's metadata; vLLM compares against it at import.
STUB_TORCH_VERSION = "2.14.0"

TOUCHES: Counter = Counter()
_armed = False


class counting:
    """Context manager: count stand-in use inside the block."""

    def __enter__(self):
        global _armed
        _armed = True

    def __exit__(self, *exc):
        global _armed
        _armed = False


def _touch(name):
    if _armed:
        TOUCHES[name] += 1


def _stub_attribute(owner, owner_name, module, name):
    """A stand-in class for ``owner.name`` (a stand-in module or class), made once and kept
    on ``owner``; dunder names stay missing so that Python's protocols fall back."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    _touch(f"{owner_name}.{name}")
    attr = _StubType(name, (_Stub,), {"__module__": module})
    attr.__qualname__ = f"{owner_name}.{name}"
    setattr(owner, name, attr)
    return attr


class _StubType(type):
    """Metaclass of every stand-in: a stand-in class answers any attribute."""

    def __getattr__(cls, name):
        return _stub_attribute(cls, cls.__qualname__, cls.__module__, name)

    def __call__(cls, *args, **kwargs):
        _touch(f"{cls.__qualname__}()")
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _StubType):
            return args[0]
        return super().__call__()

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())


class _Stub(metaclass=_StubType):
    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)

    def __call__(self, *args, **kwargs):
        _touch(f"{type(self).__qualname__}()")
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Stub()


def _any_operator(self, *args):
    return _Stub()


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv",
              "floordiv", "rfloordiv", "mod", "rmod", "pow", "rpow", "and", "rand",
              "or", "ror", "lt", "le", "gt", "ge", "neg", "pos", "getitem"):
    setattr(_Stub, f"__{_name}__", _any_operator)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        return _stub_attribute(self, self.__name__, self.__name__, name)


def _not_initialized():
    return False


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        if spec.name == "torch":
            module.__version__ = STUB_TORCH_VERSION
        if spec.name == "torch.distributed":
            # vLLM's logger asks before a warning_once whether this process leads its
            # torch.distributed group; the harness is one engine core without a
            # process group, so the true answer is given (and not counted as use).
            module.is_initialized = _not_initialized
        return module

    def exec_module(self, module):
        pass


def _prepare_environment():
    for key in [k for k in os.environ if k.startswith("VLLM_")]:
        del os.environ[key]
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.pop("PYTHONHASHSEED", None)
    # vLLM's own logging setup runs in its engine entry points, which the harness
    # does not use; without it warnings would reach Python's last-resort handler.
    logging.getLogger("vllm").setLevel(os.environ.get("CONFORMANCE_VLLM_LOG", "ERROR"))


def load(site):
    """Makes vLLM importable from ``site`` (the wheel's unpacked .py files) and
    returns a namespace holding the vLLM classes and functions the harness uses."""
    if not os.path.isfile(os.path.join(site, "vllm", "version.py")):
        raise SystemExit(f"no vLLM sources under {site}")
    _prepare_environment()
    sys.path.insert(0, site)
    sys.meta_path.insert(0, _StubFinder())
    package = types.ModuleType("vllm")
    package.__path__ = [os.path.join(site, "vllm")]
    package.__file__ = os.path.join(site, "vllm", "__init__.py")
    sys.modules["vllm"] = package

    def imp(name):
        return importlib.import_module(name)

    V = types.SimpleNamespace()
    V.version = imp("vllm.version").__version__
    package.__version__ = V.version
    kv_utils = imp("vllm.v1.core.kv_cache_utils")
    V.kv_cache_utils = kv_utils
    V.planning = imp("vllm.v1.core.kv_cache_planning")
    V.KVCacheManager = imp("vllm.v1.core.kv_cache_manager").KVCacheManager
    V.HybridKVCacheCoordinator = imp("vllm.v1.core.kv_cache_coordinator").HybridKVCacheCoordinator
    iface = imp("vllm.v1.kv_cache_interface")
    V.FullAttentionSpec = iface.FullAttentionSpec
    V.SlidingWindowSpec = iface.SlidingWindowSpec
    V.get_kv_cache_spec_kind = iface.get_kv_cache_spec_kind
    V.get_kv_cache_spec_sliding_window = iface.get_kv_cache_spec_sliding_window
    request = imp("vllm.v1.request")
    V.Request = request.Request
    V.RequestStatus = request.RequestStatus
    V.SamplingParams = imp("vllm.sampling_params").SamplingParams
    V.check_stop = imp("vllm.v1.core.sched.utils").check_stop
    V.LoRARequest = imp("vllm.lora.request").LoRARequest
    V.get_hash_fn_by_name = imp("vllm.utils.hashing").get_hash_fn_by_name
    events = imp("vllm.distributed.kv_events")
    V.kv_events = events
    V.ZmqEventPublisher = events.ZmqEventPublisher
    V.KVEventBatch = events.KVEventBatch
    V.CacheConfig = imp("vllm.config.cache").CacheConfig
    V.KVTransferConfig = imp("vllm.config.kv_transfer").KVTransferConfig
    V.KVEventsConfig = imp("vllm.config.kv_events").KVEventsConfig
    output = imp("vllm.v1.core.sched.output")
    V.SchedulerOutput = output.SchedulerOutput
    V.CachedRequestData = output.CachedRequestData
    V.NewRequestData = output.NewRequestData
    V.KVConnectorBlockState = output.KVConnectorBlockState
    V.KVConnectorOutput = imp("vllm.v1.outputs").KVConnectorOutput
    V.OffloadingConnector = imp(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector").OffloadingConnector
    V.KVConnectorRole = imp("vllm.distributed.kv_transfer.kv_connector.v1.base").KVConnectorRole
    V.OffloadingWorkerMetadata = imp(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common").OffloadingWorkerMetadata
    V.torch = imp("torch")
    return V
