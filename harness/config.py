"""Structured configs (dataclasses) registered in Hydra's ConfigStore.

``conf/config.yaml`` composes the run's schema (``run_config_class``) with one group per
concern: ``model`` and ``selection`` and ``timing`` (YAML in ``conf/``), ``scenario`` (one option
per registered scenario: ``decode``, ``extend``, ...), and one group per backend or scenario that
has settings, under its own name (``hisparse.*``, ``extend.*``, ...), whose dataclass the backend's
or scenario's module declares. ``sweeps/*.yaml`` are registered as the ``sweep`` group
(``+sweep=NAME``). The plain top-level keys (``backend``, ``page_size``, ``top_k``,
``batch_size``, ``context_len``, ``steps``, ``num_layers``, ``pattern``, ``step_overlap``,
``extend_len``) are the axes a sweep varies; ``${model.*}`` interpolations give them model
defaults. ``phase`` is the old name of ``scenario`` (``phase=extend`` = ``scenario=extend``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
SWEEPS_DIR = ROOT / "sweeps"


@dataclass
class ModelConfig:
    """Attention geometry of a DSA model (one MLA layer in MQA form + its lightning indexer)."""

    name: str = "auto"            # dsv32 | tiny | auto (GPU -> dsv32, CPU -> tiny)
    num_heads: int = 128          # query heads H
    d_nope: int = 512             # latent (no-RoPE) dims of a KV row; V = these dims
    d_rope: int = 64              # RoPE dims of a KV row
    d_v: int = 512                # output dims (first d_v dims of the KV row)
    index_heads: int = 64         # lightning-indexer heads
    index_dim: int = 128          # lightning-indexer head dim
    top_k: int = 2048             # index_topk
    layers: int = 61              # layers of the full model (capacity view); runs simulate num_layers
    sm_scale: float = 0.07216878364870323  # softmax scale (192 ** -0.5 for DeepSeek-V3.2)
    context_len: int = 32768      # default context for runs of this model
    batch_size: int = 32          # default batch for runs of this model
    # The rest of a MoE decode layer (harness/rest_of_layer.py); kv_lora_rank = d_nope,
    # qk_rope_head_dim = d_rope, index_n_heads = index_heads, index_head_dim = index_dim.
    # Source: DeepSeek-V3.2-Exp inference/config_671B_v3.2.json (dim, q_lora_rank, ...).
    hidden_size: int = 7168       # model width ("dim")
    q_lora_rank: int = 1536       # query latent rank (wq_a output)
    qk_nope_head_dim: int = 128   # per-head no-RoPE query/key dims (before W_UK absorption)
    v_head_dim: int = 128         # per-head value dims (W_UV output)
    moe_intermediate_size: int = 2048  # one expert's intermediate width ("moe_inter_dim")
    n_routed_experts: int = 256   # routed experts per MoE layer
    num_experts_per_tok: int = 8  # routed experts per token ("n_activated_experts")
    n_shared_experts: int = 1     # shared experts (each of moe_intermediate_size)

    @property
    def d_qk(self) -> int:
        return self.d_nope + self.d_rope


@dataclass
class SelectionConfig:
    """Where each layer's top-k comes from."""

    source: str = "synthetic"     # synthetic | trace | indexer
    path: Optional[str] = None    # trace to replay (source=trace)
    record: Optional[str] = None  # write this run's selections as a trace (.npz)
    cluster_len: int = 16         # run length of the clustered pattern (tokens)
    num_sinks: int = 64           # leading tokens of the prefix/mixed patterns
    window: int = 512             # trailing tokens of the mixed pattern
    fuse_topk: bool = True        # source=indexer: fused top-k + index transform
    query_corr: float = 0.9       # source=indexer: correlation of a layer's index query between steps
    query_dtype: str = "fp8"      # source=indexer: index query precision: fp8 (vLLM's, per-head power-of-two scale) | bf16
    reuse_overlap: float = 0.70   # pattern=calibrated: P(a selected token is selected at the next step)
    reuse_alpha: float = 0.45     # pattern=calibrated: P(reuse distance > d) = (1 - reuse_overlap) * d ** -reuse_alpha
    layer_share: float = 0.85     # pattern=calibrated: fraction of positions a layer inherits from the layer below


@dataclass
class TimingConfig:
    warmup_steps: int = 2         # decode steps excluded from the numbers
    cold_l2: bool = True          # flush the L2 before each timed layer step
    cold_host_translations: bool = False  # evict the GPU's host-address translations before each timed step (a 4 GiB host buffer read a word a 4 KiB page): what a served model's other layers do between two swap-ins of one layer (BENCHMARKS 6v)
    cuda_graph: bool = False      # time CUDA-graph replays of each layer step
    launch_shield_us: float = 1000.0  # GPU spin before each timed step so launches queue behind it
    check_tolerance: float = 0.03 # max ||out - ref|| / ||ref|| for status=ok


#: the run's own keys (besides the groups); the axes a sweep varies
CORE_FIELDS = [
    ("scenario", str, "decode"),        # kind of point: decode steps, an extend (prefill) step, or capacity under an HBM budget
    ("phase", Optional[str], None),     # old name of scenario (decode | extend)
    ("extend_len", int, 128),           # scenario=extend: new query tokens per request
    ("backend", str, "all"),            # serving design to run, or all (every backend on the same selection)
    ("attention_kernel", str, "triton"),  # attention of every backend: triton, triton_ws, triton_ws_f16p, triton_ws_bf16p (ours) or flashmla (upstream, optional extra)
    ("kv_dtype", str, "fp8_ds_mla"),    # KV row format: fp8_ds_mla (656 B rows at dsv32) or bf16 (1152 B)
    ("kv_scale_format", str, "raw"),    # fp8_ds_mla tile scales: raw max(amax/448, FLT_MIN) (vLLM's cache writer) or pow2 (FlashMLA's quantizer)
    ("page_size", int, 64),             # tokens per KV page
    ("top_k", int, "${model.top_k}"),   # tokens selected per query and layer
    ("batch_size", int, "${model.batch_size}"),  # requests decoded together
    ("context_len", int, "${model.context_len}"),  # prompt tokens before the first decode step
    ("steps", int, 6),                  # decode steps, warm-up included
    ("num_layers", int, 2),             # layers simulated per step
    ("pattern", str, "random"),         # shape of synthetic selections (selection=synthetic)
    ("step_overlap", float, 0.85),      # fraction of a layer's selection kept from the previous step
    ("seed", int, 0),                   # seed of every random input (KV, queries, selections)
    ("device", str, "auto"),            # where kernels run: auto = cuda when present, else cpu (Triton interpreter)
    ("overwrite", bool, False),         # re-run points whose result.parquet exists (a re-run skips them otherwise)
    ("report", bool, True),             # write the report at the end of a run / sweep
]


def settings_groups():
    """``(name, dataclass)`` of every backend and scenario that declares settings: each is a
    config node (and ConfigStore group) of that name."""
    from backends import backend_classes
    from harness.scenarios import scenario_classes
    return [(c.name, c.settings) for c in (*backend_classes(), *scenario_classes()) if c.settings is not None]


def run_config_class() -> type:
    """The run's schema: the concerns' configs, every declared settings node, the core keys."""
    groups = [("model", ModelConfig, field(default_factory=ModelConfig)),
              ("selection", SelectionConfig, field(default_factory=SelectionConfig)),
              ("timing", TimingConfig, field(default_factory=TimingConfig))]
    groups += [(name, cls, field(default_factory=cls)) for name, cls in settings_groups()]
    core = [(n, t, field(default=d)) for n, t, d in CORE_FIELDS]
    return make_dataclass("RunConfig", groups + core)


def backend_settings(cfg, name: str):
    """``(class, settings)`` of backend ``name`` for a resolved run config: its settings
    dataclass built from the ``<name>`` node with defaults resolved for ``top_k``."""
    from backends import backend_class
    from harness.scenarios.base import settings_values
    cls = backend_class(name)
    node = cfg.get(name) if cls.settings is not None else None
    return cls, cls.make_settings(settings_values(node) if node is not None else {}, cfg.top_k)


def register_configs() -> None:
    """Registers the schema, the settings groups, the ``scenario`` group and the ``sweep`` group
    (one entry per ``sweeps/*.yaml``)."""
    from harness.scenarios import SCENARIOS
    cs = ConfigStore.instance()
    cs.store(name="run_config", node=run_config_class())
    for name, cls in settings_groups():
        cs.store(group=name, name="default", node=cls)
    for name in SCENARIOS:
        cs.store(group="scenario", name=name, node={"scenario": name}, package="_global_")
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        cs.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")


def load_model_preset(name: str) -> dict:
    """The fields of ``conf/model/NAME.yaml`` as a dict (used to resolve ``model=auto``)."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    cfg.pop("defaults", None)
    return cfg
