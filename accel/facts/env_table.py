"""The table of every environment variable accel reads: the launcher <-> library contract.

Each :class:`EnvVar` row names a variable (accel's ``ACCEL_*`` spelling first where it has one, then
Accelerate's), what it means, who writes it and which modules read it; each :class:`EnvFamily` row a
prefix whose members follow a launch option's name. :mod:`accel.facts.environment` holds the parser
and hands these names out on first use, so modules that only read a flag do not build the table.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ENV_FAMILIES", "ENV_VARS", "EnvFamily", "EnvVar", "LAUNCH", "USER", "contract_entry"]

LAUNCH = "accel launch"
USER = "user"


class EnvVar(NamedTuple):
    """One variable: its name (accel's spelling first when it has one), Accelerate's spelling read after it,
    what it means, who writes it and which modules read it."""

    name: str
    meaning: str
    writer: str
    readers: tuple[str, ...]
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling, in the order they are read (the first set one wins)."""
        return (self.name, *self.aliases)


class EnvFamily(NamedTuple):
    """Variables named ``prefix`` + an upper-cased option (``FSDP_`` + ``SHARDING_STRATEGY``)."""

    prefix: str
    meaning: str
    writer: str
    readers: tuple[str, ...]


def _both(suffix: str, meaning: str, writer: str, *readers: str) -> EnvVar:
    """A variable read as ``ACCEL_<suffix>`` first, then as Accelerate's ``ACCELERATE_<suffix>``."""
    return EnvVar(f"ACCEL_{suffix}", meaning, writer, tuple(readers), (f"ACCELERATE_{suffix}",))


def _one(name: str, meaning: str, writer: str, *readers: str) -> EnvVar:
    return EnvVar(name, meaning, writer, tuple(readers))


_ROWS: tuple[EnvVar, ...] = (
    # ---- the launch: written by accel launch for every rank, read by the library
    _both("USE_CPU", "run on the host cpu even where an accelerator is present", LAUNCH,
          "accel.state", "accel.resolve"),
    _both("MIXED_PRECISION", "the precision (one of accel.facts.precision.PRECISIONS)", LAUNCH, "accel.state"),
    _both("DEBUG_MODE", "debug mode: collectives check their inputs' shapes across ranks", LAUNCH,
          "accel.state", "accel.commands.launch", "accel.utils.environment"),
    _both("USE_DEEPSPEED", "the DeepSpeed strategy", LAUNCH, "accel.resolve", "accel.state"),
    _both("USE_FSDP", "the FSDP strategy", LAUNCH, "accel.resolve", "accel.state", "accel.utils.fsdp_utils"),
    _one("ACCELERATE_USE_PARALLELISM_CONFIG", "build a ParallelismConfig from PARALLELISM_CONFIG_*", LAUNCH,
         "accel.resolve"),
    # set in a SageMaker estimator's environment (accel.utils.launch.prepare_sagemager_args_inputs) for the job
    _one("ACCELERATE_USE_SAGEMAKER", "the job runs on Amazon SageMaker", LAUNCH),
    _one("ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE", "SageMaker's distribution: NO, DATA_PARALLEL or MODEL_PARALLEL", LAUNCH),
    _both("GRADIENT_ACCUMULATION_STEPS", "gradient accumulation steps when the Accelerator is given none", LAUNCH,
          "accel.facade.options", "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_GRADIENT_CLIPPING", "gradient clipping for DeepSpeed's config", LAUNCH,
         "accel.strategies.deepspeed.config"),
    _both("DYNAMO_BACKEND", "torch.compile backend (TorchDynamoPlugin)", LAUNCH, "accel.utils.dataclasses"),
    _both("DYNAMO_MODE", "torch.compile mode", LAUNCH, "accel.utils.dataclasses"),
    _both("DYNAMO_USE_FULLGRAPH", "torch.compile fullgraph", LAUNCH, "accel.utils.dataclasses"),
    _both("DYNAMO_USE_DYNAMIC", "torch.compile dynamic shapes", LAUNCH, "accel.utils.dataclasses"),
    _both("DYNAMO_USE_REGIONAL_COMPILATION", "compile repeated blocks one by one", LAUNCH, "accel.utils.dataclasses"),
    _both("FP8_BACKEND", "fp8 library: AO, TE or MSAMP", LAUNCH, "accel.precision.fp8", "accel.strategies.deepspeed.config"),
    # Accelerate's PartialState pins the rank when this is set; accel's state does not read it yet
    _one("ACCELERATE_CPU_AFFINITY", "pin each rank to the cores of its NUMA node", LAUNCH),
    _one("ACCELERATE_CONFIG_DS_FIELDS", "DeepSpeed settings that came from the launch config (not the JSON)", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_CONFIG_FILE", "DeepSpeed JSON config file", LAUNCH, "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_ZERO_STAGE", "DeepSpeed ZeRO stage", LAUNCH, "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "ZeRO optimizer offload: none, cpu or nvme", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "ZeRO-3 parameter offload: none, cpu or nvme", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "folder of the optimizer's NVMe offload", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "folder of the parameters' NVMe offload", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_ZERO3_INIT", "build the model sharded (zero.Init) under ZeRO-3", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "gather a 16-bit model when saving under ZeRO-3", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", "mixture-of-experts layer classes (ZeRO-3 leaf modules)", LAUNCH,
          "accel.strategies.deepspeed.config"),
    _one("ACCELERATE_DEBUG_RDV_FILE", "file store of a debug launch's rendezvous", "debug_launcher", "accel.utils.launch"),
    _one("ACCEL_LAUNCH_RUN_DIR", "folder of the ranks' heartbeat and stack files", LAUNCH, "accel.launch.heartbeat"),
    _one("ACCEL_LAUNCHER_PID", "process id of the launcher a rank belongs to", LAUNCH, "accel.launch.bootstrap"),
    _one("ACCEL_TEST_EXPECTED_WORLD_SIZE", "world size `accel test` asked for; the smoke script checks it",
         "accel test", "accel.test_utils.scripts.smoke", "accel.test_utils.scripts.test_cli"),
    # ---- set by the user (or a config) to steer a run
    _one("ACCEL_DEVICE", "the backend to use instead of detection", USER,
         "accel.backends.registry", "accel.sysinfo", "accel.commands.launch", "accel_harness.plugin"),
    _one("ACCEL_PROFILE", "a device profile file to load as a backend", USER, "accel.backends.registry"),
    _one("ACCEL_COMMAND_LINE", "the command line a person typed, handed by accel qualify to its pytest children so "
         "their run headers record it", "accel.commands.qualify", "accel_harness.fingerprint"),
    _one("ACCEL_HISTORY_CONNECT_TIMEOUT", "seconds to wait for a PostgreSQL run history to answer (default 10; the "
         "URL's connect_timeout wins)", USER, "accel_reports.history.db"),
    _one("ACCEL_PROFILE_HOOK_TIMEOUT", "seconds a device profile's hook may run without progress in the hook check "
         "before it counts as hung", USER, "accel.backends.hook_check"),
    _one("ACCEL_PROFILE_HOOKS_CHECKED", "device profiles (path and content hash) whose hooks this run checked already",
         "accel.backends.hook_check", "accel.backends.hook_check"),
    _one("ACCELERATE_BYPASS_DEVICE_MAP", "let prepare() take a model spread over devices by a device map in a "
         "distributed run", USER, "accel.facade.model_wrappers"),
    _one("ACCEL_CPU_COMM_BACKEND", "collective backend on the host: gloo, ccl or mpi", USER, "accel.backends.cpu"),
    _one("ACCEL_CONFIG_FILE", "the launch config file", USER, "accel.launch.config_file", "accel.sysinfo"),
    _one("ACCEL_HANG_TIMEOUT", "seconds without progress before a launch is called hung (0 never)", USER,
         "accel.commands.launch"),
    _one("ACCEL_LAUNCH_NODE_TIMEOUT", "seconds another node's launcher may stay silent before a launch on several "
         "nodes calls that node lost, and node 0's store is given to answer a joining node (default 10)", USER,
         "accel.launch.nodes"),
    _both("TORCH_DEVICE", "the torch device to use instead of the backend's default", USER, "accel.state"),
    _both("LOG_LEVEL", "level of accel's loggers", USER, "accel.logging"),
    _both("INIT_INCLUDE_BUFFERS", "init_empty_weights also puts buffers on the meta device", USER, "accel.big_modeling"),
    _both("NUM_PROCESSES", "process count of the notebook-launcher test script", USER,
          "accel.test_utils.scripts.test_notebook"),
    _one("ACCEL_TEST_PORT", "rendezvous port of the notebook-launcher test script (default: the default port)",
         USER, "accel.test_utils.scripts.test_notebook"),
    _one("ACCEL_CHECKPOINT_CHECKSUMS", "write and verify checkpoint checksums (default yes)", USER,
         "accel.checkpointing"),
    _one("USE_TORCH_XLA", "use torch_xla where it is installed (default yes)", USER,
         "accel.backends.xla", "accel.utils.imports"),
    _one("RUN_SLOW", "run the tests marked @slow (accel.test_utils)", USER, "accel.test_utils.testing"),
    # ---- tools
    _one("ACCEL_SUITES_DIR", "the conformance suites folder", USER, "accel_harness.suites_location"),
    _one("ACCEL_BENCH_QUICK", "smaller benchmark problems and fewer rounds", "accel bench", "suites.benchmarks"),
    _one("ACCEL_BENCH_SET", "the benchmark set (core: the standard set, fewer rounds)", "accel bench", "suites.benchmarks"),
    _one("ACCEL_BENCH_THREADS", "torch threads of the benchmark process", "accel bench", "suites.benchmarks"),
    _one("ACCEL_BENCH_SUITES", "the benchmark suites folder", USER, "accel.commands.bench"),
    _one("ACCEL_BENCH_HOST_PROBE", "time a host reference beside the benchmarks (default yes)", USER,
         "suites.benchmarks"),
    _one("ACCEL_BENCH_KEEP_HEAP", "record the heap size beside the benchmarks (default yes)", USER,
         "suites.benchmarks"),
    _one("ACCEL_BENCH_STARTS", "file the harness-overhead benchmark writes its start times to", "suites.benchmarks",
         "suites.benchmarks"),
    _one("ACCEL_CI_PROFILE", "install profile of a CI cell", USER, "ci.matrix"),
    _one("ACCEL_CI_PIP_ARGS", "extra pip arguments of a CI cell", USER, "ci.run_cell"),
    _one("ACCEL_CI_VENV_CACHE", "folder of the CI cells' virtual environments", USER, "ci.run_cell"),
    _one("ACCEL_CI_INCLUDE_DISABLED", "plan disabled matrix cells too", USER, "ci.plan"),
)

#: every variable by its first name
ENV_VARS: dict[str, EnvVar] = {row.name: row for row in _ROWS}

_FSDP = ("accel.strategies.fsdp.plugin", "accel.utils.fsdp_utils")

#: variables named after a launch option; each member is ``prefix`` + the option's upper-cased name
ENV_FAMILIES: dict[str, EnvFamily] = {
    family.prefix: family for family in (
        EnvFamily("FSDP_", "FSDP plugin settings (FSDP_VERSION, FSDP_SHARDING_STRATEGY, ...)", LAUNCH, _FSDP),
        EnvFamily("PARALLELISM_CONFIG_", "ParallelismConfig sizes and backends (..._TP_SIZE, ..._CP_BACKEND, ...)",
                  LAUNCH, ("accel.parallelism_config", "accel.utils.dataclasses._parallel")),
        EnvFamily("ACCEL_FP8_", "fp8 recipe settings (accel's spelling, read first)", USER,
                  ("accel.utils.dataclasses", "accel.precision.fp8")),
        EnvFamily("ACCELERATE_FP8_", "fp8 recipe settings (..._FORMAT, ..._MARGIN, ..._OPT_LEVEL, ...)", LAUNCH,
                  ("accel.utils.dataclasses", "accel.precision.fp8", "accel.strategies.deepspeed.config")),
        EnvFamily("ACCELERATE_MEGATRON_LM_", "Megatron-LM plugin defaults (..._TP_DEGREE, ...)", LAUNCH,
                  ("accel.utils.megatron_lm",)),
    )
}

_BY_NAME: dict[str, EnvVar] = {name: row for row in _ROWS for name in row.names}


def contract_entry(name: str) -> EnvVar | EnvFamily | None:
    """The table row for the variable ``name`` (a spelling or a family member), None when it has none."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    for prefix, family in ENV_FAMILIES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return family
    return None
