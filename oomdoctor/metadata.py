"""The `oomdoctor` key of a dump: the contract between capture (writer) and load/analysis (readers).

A dump is torch's snapshot dict, untouched, plus one extra top-level key, METADATA_KEY, holding a
dict of builtins only (str, int, float, bool, None, list, dict) so that the restricted unpickler
and memory_viz both read it. Every field is optional for readers: old or partial dumps omit some.

    schema_version      int, SCHEMA_VERSION
    versions            {"oomdoctor", "torch", "cuda", "python", "cudnn", "nccl"}: str | None (cudnn and
                        nccl only where torch was built with them and CUDA is there)
    host, pid, argv     str, int, list[str]
    rank, local_rank, world_size   int | None (RANK, LOCAL_RANK, WORLD_SIZE and friends)
    device              {"index", "name", "capability": [major, minor], "total_memory_bytes"}
    mem_get_info        {"free_bytes", "total_bytes"} at dump time
    memory_stats        {"num_alloc_retries", "num_ooms", "inactive_split_bytes",
                         "allocated_bytes", "reserved_bytes", "active_bytes",
                         "peak_allocated_bytes", "peak_reserved_bytes", ...} at dump time
    alloc_conf          {"PYTORCH_CUDA_ALLOC_CONF": str, "PYTORCH_ALLOC_CONF": str, ...} (only set ones)
    environment         {name: value} of the set environment variables that bear on memory, as vLLM's
                        collect_env lists them (prefixes PYTORCH_, TORCH, CUDA, NCCL_, CUBLAS, CUDNN,
                        NVIDIA_, OMP_, MKL_, TORCHELASTIC_, OOMDOCTOR_, ...); names that look secret
                        (TOKEN, KEY, SECRET, PASSWORD, ...) are never written
    packages            {import name: version} of the frameworks the process had imported at the dump
                        (lightning, transformers, accelerate, deepspeed, vllm, ...); none is imported
    elastic             under torchrun only (TORCHELASTIC_RUN_ID set), else None: {"run_id": str,
                        "restart_count", "max_restarts", "group_rank", "group_world_size", "role_name",
                        "role_rank", "role_world_size", "local_world_size"}; the ranks of one launch
                        write their dumps into the folder `run-{run_id}` under the dump folder
    framework           written when a framework callback installed capture (oomdoctor.integrations):
                        {"name": "lightning" | "transformers", "version", "stage", "global_step",
                        "epoch"}; stage is where the framework's loop was at the dump, one of
                        FRAMEWORK_STAGES (training, validating, sanity_checking, testing,
                        predicting, evaluating, saving_checkpoint) or None
    oom                 the observer call that triggered this dump, or None for dump():
                        {"device", "alloc_bytes", "device_total_bytes", "device_free_bytes", "time_us",
                         "surfaced", "site", "occurrence"}; surfaced: True once the OutOfMemoryError
                        reached Python, False when torch caught and retried it internally, None when
                        not known (yet); site "file:line in function", the innermost frame outside
                        oomdoctor and torch; occurrence: the how-manieth OOM at its Python stack
    ooms_observed       list of such dicts: every observer call seen in this process, including
                        OOMs torch caught and retried internally
    exception           {"type", "message", "traceback", "caught"} once the OOM surfaced, else None;
                        traceback is None and caught True when the script caught the exception and
                        went on (a batch-size finder's probe); caught False once it was uncaught
    markers             list of {"phase", "edge", "step", "time_us"}: phase is one of PHASES,
                        edge "start" | "end", step the optimizer step index (0-based count of
                        completed optimizer steps when the phase began), time_us epoch
                        microseconds on the same clock as trace events' time_us
    optimizers          int: how many optimizers (`torch.optim.Optimizer`) the process had made (after
                        install(); or, made before it, stepped) and still held at the dump; one there
                        tells the run trains, even before its first backward
    optimizer_kinds     list of {"class", "moments", "options"}, one for each optimizer `optimizers`
                        counts (in no set order; absent in older dumps): class is the qualified
                        name of its class ("torch.optim.sgd.SGD", "bitsandbytes.optim.adam.Adam8bit");
                        moments: int | None, the parameter-sized state tensors it makes for each
                        parameter it updates, for torch's own optimizers (SGD 0 without momentum and
                        1 with it; Adam and AdamW 2, 3 with amsgrad; RMSprop 1, +1 with momentum, +1
                        centered; Adagrad, ASGD, Muon 1; Adamax, NAdam, RAdam, Adadelta, Rprop,
                        SparseAdam 2), None for any other class (a subclass of torch's too), for one
                        whose state is no whole number of its parameters (Adafactor, LBFGS) and
                        where its param groups' settings differ; options: {setting: bool | int |
                        float | None}, the settings that decide it ({"momentum": 0.0}), each as every
                        param group has it (None: the groups differ); {} for other classes. At most
                        MAX_OPTIMIZER_MOMENTS moments: a reader drops a larger count
    tensors             list of {"address", "device", "component", "name", "shape", "dtype",
                        "size_bytes"}: the storage data_ptr of every named tensor of the models
                        and optimizers the process used; component is one of REGISTRY_COMPONENTS;
                        size_bytes is the tensor's own numel x element size (views and tied
                        tensors can share an address); names are named_parameters() names,
                        gradients "<param>.grad", optimizer state "<param>.<key>" (exp_avg);
                        a flat buffer (a storage several registered tensors of one component
                        are views into: a DDP bucket, DeepSpeed ZeRO's flat groups) is one
                        entry with the storage's bytes and 1-D shape, named "<what it is> (<n>
                        <noun>: <first> … <last>)" ("DDP gradient bucket (12 gradients:
                        fc1.weight.grad … fc3.bias.grad)"); DeepSpeed ZeRO's fp32 partitions
                        are "ZeRO-2 fp32 partition of group 0" (docs/capture.md);
                        component "input": a tensor passed to a model's outermost call (its
                        latest), still alive, not a parameter, buffer or other registered
                        tensor and not an autograd result (no grad_fn), named
                        "<ModelClass>.forward arg 0", "<ModelClass>.forward kwarg attention_mask",
                        "<ModelClass>.forward arg 1[0]" (inside a list, tuple or dict argument);
                        input entries come after all others; a parameter's entry also has
                        "requires_grad": bool (False: frozen, as a LoRA base is: it gets no gradient
                        and no optimizer state; absent in older dumps and on flat buffers that are
                        not module parameters: not known)
    recording           {"max_entries", "stacks", "context", "started_by": "oomdoctor" | "user",
                        "rearmed"}: how torch's history was recorded at the dump (started_by "user":
                        the script had already turned it on, with settings oomdoctor did not
                        choose); when something else called `_record_memory_history` after
                        install() (torchtitan's MemoryProfiler), the settings are the latest call's
                        and "rearmed" lists the calls, oldest first (at most MAX_HISTORY_CALLS):
                        {"action": one of HISTORY_ACTIONS, "time_us", "caller": "file:line in
                        function" ("oomdoctor" for "restored"), "enabled", "context", "stacks",
                        "max_entries" (None: not given, torch's default keeps every event)};
                        "rearmed": another caller turned recording on with its settings (the
                        history may be cut there), "stopped": it turned recording off (torch
                        clears the history), "restored": capture turned it on again at once with
                        its own settings; a last "stopped" means the history ends there
    reason              "oom" | "manual" | "peak": why the dump was written
    rehearsal           present only for dumps written under `oomdoctor rehearse`:
                        {"device_memory_bytes", "outside_bytes", "alloc_conf"}
"""

from __future__ import annotations

from oomdoctor.vocabulary import FINDING_ONLY_VERDICTS, Component, FrameworkStage, Phase, RegistryComponent, Verdict

METADATA_KEY = "oomdoctor"
SCHEMA_VERSION = 1

# The words capture writes into a dump are plain strings (a dump holds builtins only: an enum member
# would pickle as a global, which the restricted unpickler refuses); each is defined once, in
# oomdoctor.vocabulary.
PHASE_FORWARD = Phase.FORWARD.value
PHASE_BACKWARD = Phase.BACKWARD.value
PHASE_OPTIMIZER = Phase.OPTIMIZER_STEP.value
PHASE_ZERO_GRAD = Phase.ZERO_GRAD.value
PHASE_EVALUATION = Phase.EVALUATION.value
PHASES = (PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_ZERO_GRAD, PHASE_EVALUATION)

FRAMEWORK_STAGES = tuple(stage.value for stage in FrameworkStage)

# recording.rearmed[].action (see above)
HISTORY_REARMED, HISTORY_STOPPED, HISTORY_RESTORED = "rearmed", "stopped", "restored"
HISTORY_ACTIONS = (HISTORY_REARMED, HISTORY_STOPPED, HISTORY_RESTORED)
MAX_HISTORY_CALLS = 100

# optimizer_kinds[].moments: torch's optimizers make at most 3 (AdamW with amsgrad, centered RMSprop
# with momentum); a reader takes no larger count from a file
MAX_OPTIMIZER_MOMENTS = 16

COMPONENT_PARAMETER = RegistryComponent.PARAMETER.value
COMPONENT_GRADIENT = RegistryComponent.GRADIENT.value
COMPONENT_OPTIMIZER_STATE = RegistryComponent.OPTIMIZER_STATE.value
COMPONENT_BUFFER = RegistryComponent.BUFFER.value
COMPONENT_INPUT = RegistryComponent.INPUT.value
REGISTRY_COMPONENTS = tuple(c.value for c in RegistryComponent)

# Components of live bytes that analysis reports and fixtures/manifest.json records, in this order.
COMPONENTS = tuple(c.value for c in Component)
# The components a fixture's ground truth records (fixtures/manifest.json): all but those only
# inference names (a library workspace, a large pre-allocation, unknown), which a registry and
# phase markers call "other".
TRUTH_COMPONENTS = tuple(
    c.value for c in Component if c not in (Component.WORKSPACE, Component.PREALLOCATED, Component.UNKNOWN)
)

VERDICTS = tuple(v.value for v in Verdict if v not in FINDING_ONLY_VERDICTS)  # the primary verdicts
