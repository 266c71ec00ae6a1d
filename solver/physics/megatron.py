"""How Megatron-Core runs a training step: ``solve(workload, fleet, **knobs)``.

A second physics model beside mlsysim's (``solver.distributed``), judged by its
error against measured runs (``benchmarks/fidelity.py``), not by agreement
with the reference. It is composed of the topic modules' formula functions in
named steps, like pvlib's ModelChain:

1. **split**: TP x CP x DP x PP ranks (EP folded into DP x CP, as Megatron-Core
   does [6]); microbatches ``m = batch / (dp * micro_batch)``. Realizable needs
   ``layers`` divisible by ``pp_size * v_stages`` unless the first or last stage's
   layers are set (Megatron-LM's ``validate_args`` refuses the rest [13]); a split the
   layers do not divide is priced on its heaviest stage, ``ceil(layers / pp_size)``
   layers, with the LM head on it (MoE layers only where a model's leading dense layers
   leave a stage of them: ``megatron_steps.heavy_moe_stage``), the price of a set split
   that evens it out (126 layers on 16 stages, as Llama 3 405B trained [14]: 7, 8 x 14,
   7). ``num_layers_in_first/last_pipeline_stage``
   set the first and last stages' layers as Megatron-Core does [13] (the rest split
   evenly between): the slowest of the first, a middle and the last stage (with the
   head and any MTP modules) paces the pipeline (``megatron_steps.stage_layers``).
2. **layer**: GEMM by GEMM FLOPs (:mod:`solver.flops`) timed on the accelerator's
   efficiency curve (:mod:`solver.gemm`: the size curve, plus each output tile's fixed
   time, ``K0`` columns of the GEMM's local reduction dimension after the TP split),
   FP8/FP4 for the transformer layers' GEMMs only; attention core (fused causal
   kernel at the accelerator's sourced efficiency [10], or unfused softmax);
   memory-bound kernels at HBM bandwidth; TP all-reduces (or RS + AG under SP, two
   launches; ``tp_comm_overlap`` hides ``overlap_efficiency`` of each phase's TP
   traffic, at most that share of the GEMMs its chunks run beside, and only with the TP
   group inside one NVLink domain [37]), CP ring exchange of K/V (each step's send
   beside that step's cp-th of the attention core [37]; or, by ``cp_comm_type``, the
   all-gathers of K and V, Ulysses' all-to-alls, or both in hierarchical groups [42]),
   EP all-to-all
   (:mod:`solver.network`). Each phase of a layer
   (forward; backward with any recomputed forward) takes the longer of its GPU time
   and the host's time to launch its kernels [12].
3. **pipeline**: heaviest stage (LM head on the last: its GEMMs in 16 bits and
   the FP32 cross-entropy at HBM bandwidth [11], or Transformer Engine's fused one on
   the 16-bit logits [44]), 1F1B / interleaved bubble
   ``(p-1)/v`` stage-microbatches [1] (the other stages' times over ``v`` where they
   differ: the head's and set stages' [13]), p2p activation sends (divided by TP under
   sequence parallelism, or legacy Megatron-LM's scatter/gather [26]; the steady
   state's exposed unless the interleaved schedule overlaps them [27]).
4. **data parallel**: gradient all-reduce or reduce-scatter (distributed
   optimizer) in buckets overlapped with the last microbatch's backward,
   parameter all-gather overlapped with the first forward, FSDP per-microbatch
   gathers; optimizer step at HBM bandwidth; a fixed per-step overhead.
5. **memory**: :mod:`solver.megatron_memory` on each pipeline rank that can hold the
   most (its layers, embedding or output layer and logits, microbatches in flight:
   ``megatron_steps.pipeline_ranks``; a recomputed layer's working set, on the last rank
   in place of the logits; the norms', the router's and MLA's duplicated weights whole
   on every TP rank, an MTP module's three norms split with it); the largest footprint
   counts.

The free constants (:data:`CONSTANTS`) are the all-data fit stored in
``configs/physics/megatron.toml`` with its provenance; each may be overridden
by keyword (and may be an array).

References
----------
[1] Narayanan, D. et al. (2021), "Efficient large-scale language model training
    on GPU clusters using Megatron-LM", SC21 (eq. 1 and Sec. 2.2: bubble
    (p-1)/m, interleaved (p-1)/(v m); Sec. 4.1 scatter/gather of p2p sends).
[2] Korthikanti, V. et al. (2023), "Reducing activation recomputation in large
    transformer models", MLSys (sequence parallelism: all-reduce = RS + AG).
[3] Shoeybi, M. et al. (2019), "Megatron-LM", arXiv:1909.08053 (2 all-reduces
    forward and 2 backward per layer).
[4] Liu, H. et al. (2023), "Ring attention with blockwise transformers",
    arXiv:2310.01889; Megatron-Core context parallelism docs (K/V ring, cp - 1 steps,
    overlapped with attention).
[5] Dao, T. (2023), "FlashAttention-2", arXiv:2307.08691 (backward 2.5x the
    forward FLOPs; causal blocks skipped).
[6] Megatron-Core ``parallel_state.initialize_model_parallel``: ranks in order, with
    no knowledge of the NVLink domains; the dense grid's order tp-cp-dp-pp, the expert
    grid's (MoE parallel folding) tp-ep-dp-pp with ``cp=1`` and its TP
    ``expert_tensor_parallel_size``, by default the dense TP: an EP group is ranks tp
    apart spanning ``tp ep``, expert data-parallel peers are ``tp ep`` apart, and
    ``ep_size`` must divide ``dp_size * cp_size`` (the expert data-parallel size is
    ``world / (tp ep pp)``).
[7] Megatron-Core ``distributed/distributed_data_parallel.py`` and
    ``optimizer/distrib_optimizer.py``: gradients reduced per bucket as the
    backward produces them (``overlap_grad_reduce``), parameters all-gathered
    per bucket before the forward uses them (``overlap_param_gather``); FP32
    gradient reduction for BF16 training.
[8] Calculon (Isaev et al., SC23) ``systems/*.json``: per-step network
    latencies 1 us (NVLink) and 2 us (InfiniBand).
[9] Rajbhandari, S. et al. (2020), "ZeRO", SC: stage 3 gathers parameters in
    forward and backward and reduce-scatters gradients, per microbatch.
[10] Shah, J. et al. (2024), "FlashAttention-3", arXiv:2407.08608, Fig. "Attention
    forward speed, head dim 128 (H100 80GB SXM5)", causal: FlashAttention-2 at
    298-335 TFLOP/s for 2k-16k tokens.
[11] Megatron-Core ``tensor_parallel/cross_entropy.py``
    (``_VocabParallelCrossEntropy``) on ``logits.float()``
    (``GPTModel.compute_language_model_loss``); the output layer is a plain
    ``ColumnParallelLinear``, outside Transformer Engine's FP8 autocast, so the LM
    head's GEMMs run in 16 bits under FP8 training.
[12] PyTorch CUDA semantics ("Asynchronous execution"): kernels are queued by the
    host and run when the device is free, so a step is bound by the slower of
    the host's issue rate and the device's work (CUDA Graphs exist to lift the
    host bound).
[13] Megatron-Core ``TransformerConfig.num_layers_in_first_pipeline_stage`` /
    ``num_layers_in_last_pipeline_stage`` (``--decoder-first/last-pipeline-num-layers``)
    and ``pipeline_model_parallel_layout``: uneven pipeline stages, e.g. fewer layers
    on the first and last stage when the layer count does not divide evenly. Without
    them Megatron-LM's ``arguments.validate_args`` raises "Number of layers should be
    divisible by the pipeline-model-parallel size".
[14] Dubey, A. et al. (2024), "The Llama 3 Herd of Models", arXiv:2407.21783: the
    405B model has 126 layers and trained with pipeline parallelism of 16.
[15] Megatron-LM ``megatron/training/arguments.py`` (``validate_args``): with
    ``expert_model_parallel_size > 1``, "Expert parallelism is not supported with
    fp16 training"; at tensor-parallel size 1 it turns sequence parallelism off, and
    ``--tp-comm-overlap`` asserts sequence parallelism ("Tensor parallel
    communication/GEMM overlap can happen only when sequence parallelism is
    enabled"); ``--overlap-param-gather`` asserts ``--overlap-grad-reduce`` (and the
    distributed optimizer: without it, zero_stage 0, the model gathers nothing and
    the knob changes nothing).
[16] Megatron-Core ``TransformerConfig.__post_init__``: "num_query_groups must be a
    multiple of tensor_model_parallel_size" (no replication of KV heads over TP).
[17] Megatron-Core ``pipeline_parallel/schedules.py``
    (``forward_backward_pipelining_with_interleaving``): the interleaved schedule
    runs microbatches in groups of ``microbatch_group_size_per_vp_stage``, pp by
    default; a microbatch count below pp, or not a multiple of it, raises. Each model
    chunk's gradient reduction is launched when its last microbatch's backward is done
    (``enable_grad_sync`` / ``grad_sync_func`` per chunk, ``synchronized_model_chunks``),
    and each chunk's parameter all-gather before its first forward (``param_sync_func``).
[18] Megatron-Core ``transformer/dot_product_attention.py``: the unfused attention
    asserts "Context parallelism is only supported by TEDotProductAttention!".
[19] Megatron-Core ``tensor_parallel/mappings.py``: sequence parallelism scatters
    the sequence (``seq_len / cp_size`` tokens here) over TP and asserts "First
    dimension of the tensor should be divisible by tensor parallel size".
[20] Megatron-Core ``transformer/moe/moe_layer.py`` (``MoELayer.forward``): training
    an MoE with TP > 1 without sequence parallelism raises.
[21] Transformer Engine ``check_fp8_support`` / NVFP4 support: FP8 needs compute
    capability 8.9 (Ada, Hopper), FP4 10.0 (Blackwell). The catalog states an
    accelerator's FP8 and FP4 peaks where it has them; a precision whose peak it
    does not state is not realizable (and priced at the next wider precision's peak).
[22] Megatron-Core ``models/gpt/gpt_model.py``: the last stage builds the output
    layer, sharing the first stage's embedding weights unless
    ``--untie-embeddings-and-output-weights`` (Llama, Mixtral, Qwen3, DeepSeek-V3,
    Nemotron-4). With pipeline parallelism the last stage holds a copy either way.
[23] Megatron-Core ``distributed/param_and_grad_buffer.py``: a bucket's gradients are
    a view into the one gradient buffer (``_get`` of ``grad_data``); the bucket size
    sets how the buffer is cut for communication and allocates nothing.
[24] DeepSpeed, issue #2252 (maintainer's answer): "For zero stage 2 (and 3), gradient
    reduction is required after every backward because of gradient partitioning. Each
    rank retains only the accumulated gradients of its partition and discards the
    rest", so ZeRO-2 reduce-scatters once per microbatch, not once per step.
[25] Megatron-LM ``megatron/training/arguments.py``: BF16 training accumulates and
    reduces gradients in FP32 (``accumulate_allreduce_grads_in_fp32``) unless
    ``--grad-reduce-in-bf16``; Megatron-Core ``DistributedDataParallelConfig.
    grad_reduce_in_fp32`` sets the gradient buffer's dtype. NeMo maps its optimizer's
    ``grad_sync_dtype`` onto it (``grad_reduce_in_fp32 = grad_sync_dtype == "fp32"``,
    ``MegatronGPTModel.setup_mcore_distributed_parallel``); NeMo's performance configs
    set ``grad_sync_dtype: bf16`` (NeMo-Framework-Launcher ``conf/training/gpt3/
    *_fp8_performance.yaml``, ``nemotron/nemotron_340b.yaml``). The 16-bit buffer is
    the FP16 layout of [7]'s table: 2 B of gradients, and the optimizer's FP32 copy of
    its shard (4 + 16 / d bytes per parameter with the distributed optimizer).
[26] Legacy Megatron-LM ``megatron/p2p_communication.py`` (``_communicate``): with
    ``args.scatter_gather_tensors_in_pipeline`` (on by default; off with
    ``--no-scatter-gather-tensors-in-pipeline``) a send is ``1/tp`` of the tensor and
    the receiver all-gathers it over TP. Megatron-Core's ``pipeline_parallel/
    schedules.get_tensor_shapes`` divides the sent sequence by TP only under
    ``sequence_parallel``; every TP rank otherwise sends the whole tensor.
[27] Megatron-Core ``model_parallel_config.py`` (``ModelParallelConfig.overlap_p2p_comm``,
    2023: some of the pipeline's peer-to-peer communication overlaps with computation,
    in the interleaved schedule) and ``pipeline_parallel/schedules.py`` (1F1B's
    ``send_forward_recv_backward`` and ``send_backward_recv_forward`` block). Megatron-LM's
    ``arguments.py`` (``validate_args``) refuses the interleaved schedule without it on two
    stages: "When interleaved schedule is used and p2p communication overlap is disabled,
    pipeline-model-parallel size should be greater than 2".
[28] Transformer Engine (TE 1.x as in NeMo 24.07): under FP8 with sequence parallelism
    the all-gathers move FP8 tensors. ``module/linear.py`` (``_Linear.forward``) casts
    a column-parallel layer's input to FP8 before ``gather_along_first_dim``;
    ``module/base.py`` (``grad_output_preprocess``, "FP8 case with gather: ... cast,
    transpose for efficient gather") casts a row-parallel layer's output gradient to
    FP8, then gathers it. The reduce-scatters move the 16-bit GEMM outputs.
[29] ZeRO-3 / FSDP without ``overlap_param_gather``: each layer's parameter all-gather
    blocks before the layer runs, while the gradient reduce-scatter, issued as the
    backward produces the gradients, overlaps it (``overlap_grad_reduce``; DeepSpeed's
    ``overlap_comm``, on by default at stage 3: ``runtime/zero/constants.py``,
    ``ZERO3_OPTIMIZATION_OVERLAP_COMM_DEFAULT = True``). DeepSpeed's ZeRO-3 of 2021 did
    not overlap its gathers: PR #1188 (June 2021) found that its "async" all-gather
    "is not async at all, because each all_gather calls torch.cuda.synchronize()", and
    PR #1170 fixed an off-by-one in the module trace that skipped prefetches (issue #1069).
[30] ZeRO-2/3 (FSDP) with pipeline parallelism is not runnable. DeepSpeed's
    ``runtime/pipe/engine.py`` (``PipelineEngine.__init__``) asserts "ZeRO-2 and ZeRO-3
    are incompatible with pipeline parallelism". Megatron-FSDP (``optim_grads``,
    ``optim_grads_params``) composes with TP, CP and EP, not PP: Megatron-LM issue #1455
    (2025), the Megatron Core roadmaps #4003 and #4997 (2026, "Megatron-FSDP + pipeline
    parallel compatibility", PR #2302, still planned), and PR #6081 (August 2026): "FSDP
    and PP are mutually exclusive in Megatron's standard path". The distributed
    optimizer (zero_stage 1) runs with any pipeline.
[31] Megatron-Core ``transformer/moe/token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``):
    permute, all-to-all over EP, all-gather over the expert TP group, ..., reduce-scatter
    over it, all-to-all back; the routed experts' linear layers do no TP communication of
    their own (``TEGroupedLinear``: "explicitly handled by MoE token dispatcher"), and a
    shared expert is a TP MLP with its own pair (``SharedExpertMLP``).
[32] Megatron-Core ``transformer/moe/moe_utils.py``: ``permute`` (an ``index_select`` of
    each token's k copies), ``unpermute`` (a ``scatter_add`` of the weighted copies into
    zeroed tokens) and ``sort_chunks_by_idxs`` (a split and a ``cat``, reordering the
    received copies by local expert), called by the all-to-all dispatcher around its
    exchanges: copies at HBM bandwidth, no arithmetic to speak of.
[33] Megatron-Core ``transformer/multi_latent_attention.py`` (``MLASelfAttention``) and
    ``models/gpt/gpt_layer_specs.py`` (its Transformer Engine spec), with
    ``extensions/transformer_engine.py`` (``TELinear``): multi-head latent
    attention (DeepSeek-AI (2024), "DeepSeek-V2", arXiv:2405.04434, Sec. 2.1). The down
    projections ``linear_q_down_proj`` (h -> q_lora_rank) and ``linear_kv_down_proj``
    (h -> kv_lora_rank + qk_pos_emb_head_dim) are ``TELinear`` in ``"duplicated"`` mode:
    every TP rank runs them whole on its own tokens (``[s/TP, b, h]`` under sequence
    parallelism); the up projections (``linear_q_up_proj``, ``linear_kv_up_proj`` to
    ``heads x (qk_head_dim + qk_pos_emb_head_dim)`` and ``heads x (qk_head_dim +
    v_head_dim)``) are column-parallel, all-gathering the latents (and the positional
    key) over the sequence under SP where a GQA layer gathers the h-wide input; the
    output projection is row-parallel from ``heads x v_head_dim``; the core attention
    has key width ``qk_head_dim + qk_pos_emb_head_dim`` and value width ``v_head_dim``.
    ``TELinear`` turns ``tp_comm_overlap`` off ("The user buffer name ... is not
    supported") on the shared config for any buffer but qkv, proj, fc1 and fc2, and the
    MLA projections' are q_down_proj, kv_down_proj, q_up_proj and kv_up_proj: an MLA
    model's TP communication is not overlapped. A duplicated layer's weights are whole on
    every TP rank.
[34] Megatron-Core ``transformer/multi_token_prediction.py`` (``MultiTokenPredictionLayer``)
    and ``models/gpt/gpt_model.py``: ``mtp_num_layers`` modules on the last pipeline stage
    (``mtp_process``, which also builds the shared embedding there), each the embedding of
    the tokens shifted by one more, RMSNorms of it and of the hidden state (``enorm``,
    ``hnorm``), a projection of their concatenation ``eh_proj`` (2h -> h, column-parallel,
    its input gathered under SP), one transformer layer of the decoder's last layer's kind,
    a final norm and the shared output head with its loss (DeepSeek-AI (2024),
    "DeepSeek-V3 Technical Report", arXiv:2412.19437, Sec. 2.2). Megatron-LM's model FLOPs
    (``training.py``, ``num_floating_point_operations``) count each as one more layer of
    that kind, 6 (3h + 2h^2) a token for its norms and projection, and one more logits.
[35] Megatron-Core ``pipeline_parallel/combined_1f1b.py`` ("combined 1F1B", enabled by
    ``overlap_moe_expert_parallel_comm``): "the forward pass of Transformer layers for one
    micro-batch runs in parallel with the backward pass of another ... EP A2A in forward
    step is hidden by the attention/mlp computation in the backward step, and vice versa";
    without a pipeline the first microbatch's forward and the last one's backward run
    alone, and the last backward ("want to synchronize gradients") is never paired.
    ``TransformerModelChunkSchedulePlan.run`` pairs the forward's layer i with the
    backward's layer L - 1 - i and releases each backward layer's state as it goes.
    ``pipeline_parallel/schedules.py`` (``get_pp_rank_microbatches``): the interleaved
    schedule runs one warm-up microbatch more with it, so that the forward and the
    backward of every 1F1B step are independent; the warm-up and cool-down run
    unpaired. ``transformer/transformer_config.py`` (``__post_init__``, Megatron-Core's
    2025 releases) refuses it without expert parallelism, with full recomputation, with a
    pipeline that is not interleaved (``virtual_pipeline_model_parallel_size`` unset),
    and with more than one MTP layer (Megatron-Core's main has since let full
    recomputation through on conditions, the recomputed forward's all-to-alls exposed;
    this model keeps refusing it). NVIDIA, "Combined 1F1B: Expert-Parallel All-to-All
    Overlap" (Megatron-Core user guide, features/moe_a2a_overlap).
[36] Megatron-Core ``TransformerConfig.account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split`` (``--account-for-embedding-in-pipeline-split``,
    ``--account-for-loss-in-pipeline-split``; ``transformer/transformer_config.py``
    ``__post_init__`` and ``transformer/transformer_block.py`` ``get_num_layers_to_build``,
    Megatron-Core 0.11 on): the input embedding (the loss) counts as one layer of the
    split, so the layers plus one for each split into ``pp_size`` stages of equal counts
    (each a multiple of ``v_stages`` when interleaved, else ``__post_init__`` raises) and
    the first (last) stage builds one transformer layer fewer. ``__post_init__`` refuses
    either with ``num_layers_in_first/last_pipeline_stage`` set ("cannot be set at the same
    time"). Llama 3.1 405B's 126 layers + 2 run on 8 stages of
    8 interleaved chunks; Megatron-Bridge's Qwen3-235B-A22B recipe uses both ("for proper
    layer distribution in pipeline parallelism", 94 + 2 layers on 16 stages).
[37] Transformer Engine's communication-GEMM overlap (``--tp-comm-overlap``: its
    userbuffers, ``transformer_engine.pytorch.module.base.initialize_ub``): the TP
    all-gather and reduce-scatter are split into chunks that run beside the chunks of
    the GEMM that consumes or produces them (a column-parallel layer's all-gather beside
    its GEMM, a row-parallel layer's reduce-scatter beside its; in the backward the same
    beside the data- and weight-gradient GEMMs), so they hide behind those GEMMs only,
    at most their time. Only within one node's NVLink domain: "comm+GEMM overlap is
    only possible with single-node tensor-parallelism" (NVIDIA/TransformerEngine issue
    #1071, a maintainer; userbuffers rely on CUDA IPC/multicast), extended to
    multi-node NVLink domains (GB200 NVL72) by TransformerEngine PR #1470 (TE 2.2).
    Context parallelism's P2P ring (``AttnFuncWithCPAndKVP2P`` in TE's
    ``attention/dot_product_attention/context_parallel.py``): step i's send runs beside
    step i's attention on the chunk in hand, one cp-th of the core (load-balanced
    chunks), and the last step has no send beside it; the backward sends K/V and their
    gradients together; a core recomputed (selective or full) runs its ring again.
[38] NCCL's rings over a node's NICs: NCCL "has evolved to use multiple rings to use all
    NVLinks and network cards" (NVIDIA/nccl issue #43, a maintainer, 2019); with 4 NICs
    it "creates 4 rings, each using a different NIC", and "multi-NIC aggregation works
    well when GPUs are connected through NVLink (because we can use NVLink to split the
    operations in N parts then balance the traffic onto the N NICs)" (issue #601, a
    maintainer). A collective over ranks of which g share a node so crosses the fabric
    at g NICs' rate, as the two-level collective of [3] prices it: Megatron-FSDP's and
    PyTorch FSDP2's per-layer gathers and reduce-scatters, each one NCCL collective over
    the data-parallel group. NAR21 Table 2's DeepSpeed ZeRO-3 of 2021 gathered at one
    NIC's rate (its 768- and 1,536-GPU runs of GPT-3 175B took the same time at the same
    batch, [29]): ``fsdp_own_nic``.
[39] Megatron-Core ``transformer/moe/token_dispatcher.py`` (``MoEFlexTokenDispatcher``,
    ``--moe-token-dispatcher-type flex --moe-enable-deepep``): "Flex token dispatcher
    requires TPxEP > 1"; it dispatches over the expert TP x EP group (``tp_ep_group``,
    router top-k and experts times the TP size: each TP shard of an expert a rank of its
    own), with no TP all-gather after it. DeepEP (deepseek-ai/DeepEP, README) "offers a
    set of kernels optimized for asymmetric-domain bandwidth forwarding, such as
    forwarding data from NVLink domain to RDMA domain": a token crosses the fabric once
    to each node that holds any of its experts and reaches the ranks there over NVLink,
    and goes once to each rank that holds any, where the all-to-all dispatcher sends one
    copy per routed expert; its README measures the internode kernels near a 400 Gb/s
    NIC's line rate of ~50 GB/s (H800), as the fitted fabric efficiency prices. Its
    normal kernels reach at most 8 NVLink peers (``NUM_MAX_NVL_PEERS = 8`` in its
    sources; the ranks beyond, RDMA peers): a larger NVLink domain (an NVL72 rack) is
    priced as domains of 8 joined over the NICs, and Megatron-Bridge refuses DeepEP on
    GB200 and GB300 (``validate_flex_dispatcher_backend``: "DeepEP is supported for
    Ampere, Hopper, and Blackwell (B200/B300) GPUs"): a layout with it on an NVLink
    domain above 8 is not realizable. NVIDIA's HybridEP backend, which spans an NVL72
    rack's NVLink: [50].
[51] Megatron-Core ``model_parallel_config.py`` (``cpu_offloading``: "all the activations
    are offloaded to the CPU asynchronously"; ``cpu_offloading_num_layers``: "number of
    transformer layers for which activations has to be offloaded") and
    ``transformer/transformer_config.py`` ("Currently there is no support for Pipeline
    parallelism with CPU offloading", "CPU offloading does not work when activation
    recomputation is enabled", "CPU offloading can be done only for layers less than
    {num_layers}"); Transformer Engine ``pytorch/cpu_offload.py`` (the tensors its modules
    save, copied on a D2H and an H2D stream: "D2h and h2d copying are completely hidden
    behind computation if computation time of a layer is longer than host-device
    communication time"; the peak "(num_layers - num_offloaded_layers) * T"; "Cannot
    offload all layers"); Megatron-Bridge ``scripts/performance/configs/llama/
    llama3_workload_base_configs.py`` (Llama 3 70B: ``cpu_offloading_num_layers`` 20 to 40
    on GB200 and GB300, 5 on B200, with Megatron-FSDP). Host links, one way: PCIe Gen4 x16
    32 GB/s (A100), Gen5 x16 64 GB/s (H100, H200, and B200 and B300 behind their hosts'
    Gen5 CPUs); GB200 and GB300: NVLink-C2C, 900 GB/s both ways between a Grace and its two
    GPUs, taken as 225 GB/s one way a GPU (both GPUs copying at once; an assumption, no
    per-GPU figure is published). The fine-grained offloading (``offload_modules``) is not
    modelled.
[50] Megatron-Core ``transformer/transformer_config.py`` (NVIDIA/Megatron-LM at 002526d8:
    ``moe_flex_dispatcher_backend``, "deepep" by default, "Currently only "hybridep" backend
    supports the MNNVL case"; "moe_enable_deepep is deprecated. Please use
    --moe-flex-dispatcher-backend=deepep instead"); DeepSeek's DeepEP, NVIDIA's Hybrid-EP
    (``docs/Hybrid-EP_Implementation.md``: a node is an NVLink domain, "Similar to DeepEP,
    Hybrid-EP first performs IB communication between peer GPUs, then each rank
    distributes the received inter-node data locally", its buffers one row a token and
    destination rank; ``csrc/hybrid_ep/config.cuh``: "Now we support up to 72(GB200) ranks
    per node", ``hidden_dim % 512 == 0``); Megatron-Bridge
    ``training/flex_dispatcher_backend.py`` (HybridEP on compute capabilities 8, 9 and 10:
    "HybridEP is supported for GB200, GB300 with NVL72 and for Ampere, Hopper, B200 and
    B300 GPUs") and its performance recipes (DeepSeek-V3 on GB200 at EP 64, Qwen3-235B-A22B
    on GB300 at EP 64, with ``moe_flex_dispatcher_backend="hybridep"``). Its other
    constraints (ranks a domain even, local experts times them divisible by 4) and the
    backends "deepepv2" and "ncclep" are not modelled.
[49] Megatron-Core ``transformer/moe/shared_experts.py`` (``SharedExpertMLP``: "This
    stream is used when '--moe-shared-expert-overlap' is set. The shared experts are
    scheduled into this stream to be overlapped with the dispatcher"; under it "disable TP
    related AG/RS communications in the linear module", ``parallel_mode = None`` and every
    ``ub_overlap_*`` False, the input all-gathered by ``pre_forward_comm``
    (``gather_from_sequence_parallel_region``) and the output reduce-scattered by
    ``post_forward_comm`` on that stream), ``transformer/moe/token_dispatcher.py``
    (``MoEAlltoAllTokenDispatcher``: ``linear_fc1_forward_and_act`` right after the
    tokens' all-to-all, "Make sure the shared experts fc1 is overlapped with dispatch A2A",
    ``linear_fc2_forward`` after the combine's; "Backward launch order: probs A2A -> tokens A2A
    -> shared experts fc1", ``set_tensor_grad_fn_sequence_sr`` scheduling the exchanges'
    backward first; the comments of a later Megatron-LM, as a walk-through of its commit
    60e039626 quotes them), and ``transformer/transformer_config.py``
    ("moe_shared_expert_overlap only works with alltoall or flex token dispatcher" where
    ``moe_shared_expert_intermediate_size`` is set, NVIDIA/Megatron-LM at 002526d8, whose
    ``MoEFlexTokenDispatcher.token_dispatch`` calls ``pre_forward_comm`` and
    ``linear_fc1_forward_and_act`` as the all-to-all one does; earlier releases refused the
    flex one, "only works with alltoall token dispatcher", its ``set_shared_experts``
    raising "Shared expert overlap is not supported in Flex Token Dispatcher", and
    Megatron-Bridge's ``apply_flex_dispatcher_backend`` still sets it False beside the flex
    dispatcher; "disable moe_shared_expert_overlap when enabling
    overlap_moe_expert_parallel_comm"; under selective recompute "shared_experts recompute
    cannot work with --moe-shared-expert-overlap").
[48] Megatron-Core ``transformer/transformer_config.py`` (``fp8_recipe: Optional[str] =
    "delayed"``, "If set, enables the use of FP8 precision through Transformer Engine. There
    are 4 predefined choices (1) 'delayed' ... (2) 'tensorwise' ... (3) 'mxfp8' ... (4)
    'blockwise'"), Megatron-LM ``arguments.py`` (``--fp8-recipe``, choices delayed,
    tensorwise, mxfp8, blockwise, custom; default delayed); Transformer Engine, "Datatype and
    hardware support matrix" (nvidia.github.io/TransformerEngine/support_matrix.html): FP8 per
    tensor (``DelayedScaling``, ``Float8CurrentScaling``) from compute capability 8.9, FP8
    block scaling (``Float8BlockScaling``) on 9.0 (Hopper) and 10.x (Blackwell data center),
    MXFP8 (``MXFP8BlockScaling``) on 10.x alone.
[47] Megatron-Core ``transformer/transformer_config.py`` (``recompute_modules``: "The
    submodules to recompute. choices: "core_attn", "moe_act", "layernorm", "mla_up_proj",
    "mlp", "moe", "shared_experts". default: ["core_attn"]"; ""moe_act", "layernorm", and
    "mla_up_proj" use output-discarding checkpointing"; read under
    ``recompute_granularity="selective"``; "Delayed scaling does not support moe_act and
    layernorm recompute for fp8", and "moe_act in recompute_modules is only supported with
    moe_grouped_gemm", which the model takes for granted), ``transformer/transformer_layer.py``
    (``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm`` only where the norm is no
    ``IdentityOp``, and under FP8 ``set_for_recompute_pre_mlp_layernorm`` /
    ``set_save_original_input``; not where CUDA graphs capture the norm, which the model
    does not model) and ``models/gpt/gpt_layer_specs.py`` (the norms fused into
    ``TELayerNormColumnParallelLinear``, IdentityOp in their slot, but a multi-head latent
    attention's ``input_layernorm=TENorm`` and ``pre_mlp_layernorm=TENorm if num_experts``),
    ``transformer/moe/experts.py`` (``TEGroupedMLP``: ``activation_recompute`` for
    "moe_act", ``set_save_original_input(self.linear_fc2)`` under FP8), and
    ``tensor_parallel/random.py`` (``CheckpointWithoutOutput``). Megatron-Bridge's MoE recipes
    set it (DeepSeek-V3 on GB300: ["moe_act"], on B200: ["mla_up_proj"]; Nemotron 3 Super:
    ["moe_act", "layernorm"]); ``transformer/multi_latent_attention.py`` (``recompute_up_proj``:
    ``qkv_up_checkpoint`` over the up projections and RoPE, its output discarded after the
    core attention, ``discard_output_and_register_recompute(core_attn_out)``). "mlp":
    ``transformer_layer.py`` (``recompute_mlp`` only ``if not isinstance(self.mlp,
    MoELayer)``; ``tensor_parallel.checkpoint(self.mlp, False, pre_mlp_layernorm_output)``,
    ``te_checkpoint`` under FP8); "moe" and "shared_experts": ``transformer/moe/moe_layer.py``
    (``moe_layer_recompute``: ``tensor_parallel.checkpoint(custom_forward, False,
    hidden_states)`` over the shared experts, router, dispatch, experts and combine;
    ``shared_experts_recompute``: a checkpoint of ``self.shared_experts`` inside it), and
    ``transformer_config.py`` ("shared_experts recompute cannot work with
    --moe-shared-expert-overlap": see [49]; beside
    ``overlap_moe_expert_parallel_comm``, under any granularity, "disable moe in
    recompute_modules when enabling overlap_moe_expert_parallel_comm" (in a later
    Megatron-Core, as a port of it quotes, crediting its merge request M3573, "because the
    MoE recompute path re-runs dispatch which is incompatible with overlap"; the versions
    before it lack the assert); under selective
    recompute, "mla_up_proj in recompute_modules is only supported with
    multi_latent_attention").
[46] Megatron-Core ``transformer/transformer_config.py`` (``moe_router_num_groups``:
    "Experts are divided into 'moe_router_num_groups' equal-sized groups"; "For each token,
    'moe_router_group_topk' groups are selected based on sum of
    top-('moe_router_topk'/'moe_router_group_topk') routing scores within each group"; "From
    these selected groups, 'moe_router_topk' individual experts are chosen"; "Node-limited
    routing: Set 'moe_router_num_groups' equal to number of nodes in EP group", after
    DeepSeek-V3, arXiv:2412.19437; ``__post_init__``: "When using group limited routing,
    moe_router_num_groups must be specified", the experts divisible by it,
    ``moe_router_group_topk`` no larger) and ``transformer/moe/moe_utils.py``
    (``group_limited_topk``: the groups consecutive blocks of experts, each scored by the sum
    of its ``topk // group_topk`` best, the other groups' scores masked to -inf before the
    top-k); Transformer Engine's fused router (``fused_topk_with_score_function``): "topk
    must be divisible by group_topk"; experts sit on EP ranks in consecutive blocks [6].
[45] Megatron-Core ``optimizer/optimizer_config.py`` (``OptimizerConfig``:
    ``use_precision_aware_optimizer``, "allows optimizer-related tensors (master_param,
    gradients and optimizer states) to be set to lower precision", asserted "only supported
    with distributed optimizer"; ``main_params_dtype``, ``exp_avg_dtype``,
    ``exp_avg_sq_dtype``, FP32 by default; ``store_param_remainders: bool = True``, "store
    the 16-bit FP32 parameter remainders in the optimizer state, excluding the 16 bits
    shared with the BF16 parameters"; ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``:
    set unless the master weights are FP32 under an FP8 recipe other than delayed
    scaling), ``optimizer/__init__.py`` (TE's ``FusedAdam`` built with the moments' dtypes
    and, where that holds, ``master_weights``, ``use_decoupled_grad`` and
    ``master_weight_dtype``), ``optimizer/distrib_optimizer.py`` ("When using
    precision-aware optimizer, main params are held by FusedAdam": no FP32 shard of its
    own); Transformer Engine ``pytorch/optimizers/fused_adam.py`` (FP8 moments as
    ``torch.uint8`` with an FP32 scale; remainders "only when param type is BF16 and master
    weight type is FP32"); Megatron-LM ``arguments.py`` (``--main-params-dtype`` fp32,
    fp16; ``--exp-avg-dtype``, ``--exp-avg-sq-dtype`` fp32, fp16, bf16, fp8; "--main-grads-dtype
    can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set") and its
    ``tests/unit_tests/test_optimizer.py`` (``test_precision_aware_optimizer`` over those
    dtypes, BF16 and FP8).
[44] Megatron-Core ``models/common/language_module/language_module.py``
    (``compute_language_model_loss``): with ``cross_entropy_loss_fusion`` (default False;
    Megatron-Bridge's ``GPTModelProvider``: True) and ``cross_entropy_fusion_impl`` "te",
    Transformer Engine's ``parallel_cross_entropy`` on the 16-bit logits; "native" (the
    default), ``fusions/fused_cross_entropy.py``, which casts them to FP32 and saves the FP32
    softmax as the unfused ``tensor_parallel.vocab_parallel_cross_entropy`` does. TE
    (``pytorch/triton/cross_entropy.py``): ``online_softmax_kernel`` reads each row once (in
    FP32 registers), ``cross_entropy_kernel`` reads it again and stores the gradient in
    place (``tl.store(X_ptr + X_offsets, X_block.to(grad_dtype))``), ``save_for_backward``
    keeps that buffer, and the backward's ``element_mul_kernel`` scales it in place.
[43] Megatron-LM ``megatron/training/arguments.py``: ``--fp8-param-gather``, "Keep the
    compute param in fp8 (do not use any other intermediate dtype) and perform the param
    all-gather in fp8", asserted "only supported with distributed optimizer, torch fsdp2,
    megatron fsdp, or inference mode"; ``pretrain_gpt.model_provider`` builds the model
    under Transformer Engine's ``fp8_model_init`` where it is set (the linear layers'
    weights FP8 tensors; the embedding, output layer and norms are no TE linear layers).
    Under ``fp8_recipe="mxfp8"`` Megatron-Bridge's Blackwell recipes pair it with
    ``reuse_grad_buf_for_mxfp8_param_ag``, which gathers BF16 through the gradient buffer
    and casts to MXFP8 on copy ("The parameters are cast from bf16 to MXFP8 during copy",
    ``param_and_grad_buffer.py``): priced so, 16-bit gathers (the gradient buffer reused:
    no memory of its own).
[42] Transformer Engine ``pytorch/attention/dot_product_attention/context_parallel.py``
    (NVIDIA/TransformerEngine 9c61cd7, 2025), the kinds Megatron-Core's ``cp_comm_type``
    selects (``TEDotProductAttention``; "p2p" when unset): ``AttnFuncWithCPAndKVP2P``
    sends K and V around the ring, cp - 1 times, each step's send beside the step's
    attention; ``AttnFuncWithCPAndKVAllGather`` ("KV all-gather between CP ranks is
    exposed", after Llama 3, Sec. 3.3.2) gathers K and V (``gather_along_first_dim``),
    saves only the local ones, gathers them again in the backward and reduce-scatters
    full-length dK and dV; ``AttnFuncWithCPAndQKVOA2A`` ("Like Ulysses, applying A2A to
    QKVO") runs all-to-alls of Q, K and V before one whole-sequence attention on
    heads / cp heads and of the output after it, in the backward of the output and its
    gradient and then of dQ, dK and dV, and asserts "The number of attention heads needs
    to be divisible by CP size!" of the query heads and the KV groups a TP rank holds.
    TE's tests skip MLA with the other kinds: "MLA CP currently only support KV P2P!".
    Megatron-Bridge, "Hybrid / Hierarchical Context Parallel": p2p overlaps, all_gather
    and a2a do not; "a2a+p2p" runs a2a "within inner group, p2p across outer group"
    (``hierarchical_context_parallel_sizes``, "must be set when a2a+p2p is used"; its
    product the CP size), TE's ring with the all-to-alls of Q, K, V and the output, and in
    the backward of the output and its gradient, over the first group before and after it.
[41] Megatron-LM ``megatron/training/tokenizer/tokenizer.py`` (``_vocab_size_with_padding``):
    the vocabulary is padded to a multiple of ``make_vocab_size_divisible_by`` (128 by
    default, NeMo's too) times the TP size, the embedding, the output layer and its logits
    are that wide (Llama 3's 128,256 entries are 129,024 at TP 8); Megatron-LM's own FLOP
    count takes the padded vocabulary, the model FLOPs here the workload's ``vocab_size``
    (the tokenizer's, or a size a paper states padded: GPT-3's 51,200, which the padding
    keeps where it is a multiple of 128 x TP). Megatron-Bridge pads only a vocabulary it
    takes from the tokenizer: its models converted from Hugging Face configs keep the
    config's size (``should_pad_vocab`` off), which the padding here prices up to 128 x TP
    entries wider (0.6 % of Llama 3's head at TP 8).
[40] Megatron-Core ``transformer/transformer_block.py`` (``_checkpointed_forward``) and
    ``TransformerConfig.__post_init__``: under ``recompute_granularity="full"`` with
    ``recompute_method="block"``, each model chunk (a ``TransformerBlock``: a pipeline
    stage, or one of its ``v_stages`` chunks) checkpoints its first
    ``recompute_num_layers`` layers one by one and runs the rest as a plain forward that
    stores its activations; "When using recompute_granularity: selective
    recompute_num_layers must be None"; with ``recompute_method="uniform"``, "Uniformly
    divide the total number of Transformer layers and checkpoint the input activation of
    each divided chunk" (``while layer_idx < self.num_layers_per_pipeline_rank:
    checkpoint_handler(custom(layer_idx, layer_idx + recompute_num_layers)); layer_idx +=
    recompute_num_layers``: every layer, in checkpoints of that many, ``custom(start, end)``
    reading ``self.layers[index]`` up to ``end``, past the chunk where that many do not
    divide it); "Using recompute_granularity: full so recompute_method must be "block" or
    "uniform""; ``multi_token_prediction.py``: "recompute_num_layers must be 1 for MTP
    recompute" under the uniform method; Megatron-LM ``arguments.py``: "recompute method is
    not yet supported for selective recomputing granularity", and beside
    ``overlap_moe_expert_parallel_comm`` "disable recomputation method when enabling
    overlap_moe_expert_parallel_comm".
"""

from __future__ import annotations

import math
import tomllib
import warnings
from pathlib import Path

import numpy as np

from .. import knobs as knobs_
from ..catalog import resource_dir
from .. import fused
from ..fused import ENGINES, FUSED_MIN_POINTS, buffers
from ..specs import Fleet, Workload
from . import megatron_compose as after
from . import megatron_steps as steps
from .common import caller_stacklevel

__all__ = ["solve", "prepare", "why_unrealizable", "check_shape", "ShapeWarning", "OUTPUTS",
           "KNOBS", "DEFAULTS", "CONSTANTS", "CONSTANTS_PROVENANCE", "RECOMPUTE", "PRECISIONS", "CP_COMM_TYPES", "CHOICES", "recompute_module_set",
           "load_constants"]

#: ``recompute_modules``'s value naming the same modules (:func:`.megatron_steps.recompute_module_set`).
recompute_module_set = steps.recompute_module_set
#: The model's sourced constants, kept in the steps module (documented there).
RECOMPUTE, PRECISIONS, CP_COMM_TYPES = steps.RECOMPUTE, steps.PRECISIONS, steps.CP_COMM_TYPES
SCALE_UP_STEP_LATENCY, SCALE_OUT_STEP_LATENCY = steps.SCALE_UP_STEP_LATENCY, steps.SCALE_OUT_STEP_LATENCY
GEMM_REFERENCE_PEAK, DEFAULT_GEMM_PLATEAU = steps.GEMM_REFERENCE_PEAK, steps.DEFAULT_GEMM_PLATEAU
OPTIMIZER_BYTES_TOUCHED, SOFTMAX_BYTES = steps.OPTIMIZER_BYTES_TOUCHED, steps.SOFTMAX_BYTES
FLASH_BACKWARD_RATIO, CROSS_ENTROPY_BYTES = steps.FLASH_BACKWARD_RATIO, steps.CROSS_ENTROPY_BYTES
DEFAULT_FLASH_ATTENTION_EFFICIENCY = steps.DEFAULT_FLASH_ATTENTION_EFFICIENCY
#: Vocabulary when a workload states none (GPT-2's, padded as Megatron-LM pads it).
DEFAULT_VOCAB = 51200
#: HBM bytes per token per hidden unit per layer of the memory-bound kernels outside
#: the MLP's activation, forward (the backward moves twice as much): two fused
#: layer norms (read + write 2 + 2 each) and two fused bias-dropout-adds (read the
#: GEMM output and the residual, write the sum: 2 + 2 + 2, and the 1-byte mask) [2].
ELEMENTWISE_BYTES = 22.0

#: The installed data package of the fitted constants, and the source tree's copy
#: (a checkout put on ``sys.path`` without installing).
CONSTANTS_PACKAGE = "layout_sweep_configs.physics"
_SOURCE_CONSTANTS_DIR = Path(__file__).resolve().parent.parent.parent / "configs" / "physics"


_CONSTANTS_FILE = resource_dir(CONSTANTS_PACKAGE, _SOURCE_CONSTANTS_DIR) / "megatron.toml"

#: Constant name -> (low, high, meaning). Values: :data:`CONSTANTS`.
CONSTANT_BOUNDS = {
    "gemm_scale": (1e-3, 1.0 / DEFAULT_GEMM_PLATEAU, "multiplier on the large-GEMM plateau (bf16/fp16)"),
    "fp8_gemm_scale": (1e-3, 1.5, "extra multiplier on the plateau of FP8/FP4 GEMMs"),
    "hopper_gemm_scale": (1e-3, 1.5, "extra multiplier on the GEMM plateau from Hopper on (the catalog's architecture: H100, H200; carried to B200, B300, GB200, GB300)"),
    "gemm_plateau": (0.0, 1.0, "large-GEMM plateau share of peak for every GPU and precision, in place of the catalog's measured ones; 0: the catalog's (not fitted; profiles fitted before 2026-12-04 take 0.95)"),
    "gemm_size_shift": (1e-3, 1e3, "scale of the GEMM size curve's durations"),
    "gemm_k_overhead": (0.0, 8192.0, "fixed cost per GEMM output tile, in columns of the reduction dimension at 312 TFLOP/s times the architecture's GEMM scale"),
    "attention_efficiency": (1e-3, 2.0, "multiplier on the accelerator's sourced fused-attention efficiency"),
    "elementwise_bytes": (0.0, 1e4, "HBM bytes per token per hidden unit per layer, forward (counted: ELEMENTWISE_BYTES)"),
    "layer_overhead": (0.0, 1.0, "host time to launch one layer's forward kernels; a forward takes at least this, a backward twice it (three times with full recompute) [s]"),
    "scale_up_efficiency": (1e-3, 1.0, "share of the NVLink domain's NCCL-tests bus bandwidth achieved"),
    "scale_out_efficiency": (1e-3, 1.0, "share of the NIC rate NCCL achieves across nodes"),
    "overlap_efficiency": (0.0, 1.0, "share of compute time that hides overlapped communication"),
    "step_overhead": (0.0, 1e3, "fixed time per step (data, logging, synchronization) [s]"),
    "collective_latency": (0.0, 1e-4, "fixed time per collective or p2p call (launch, handshake) [s]"),
}

#: Constants added after calibration profiles were first written, each with the value that
#: prices as the model did before it: a profile that predates one (it has every other
#: constant, as sweep.calibrate writes them, but not this one) takes this value, not the
#: shipped fit's (sweep.load_profile), so an old profile prices as it was fitted.
PREDATED_CONSTANTS = {"hopper_gemm_scale": 1.0, "gemm_plateau": 0.95}
#: Constants that are settings, never fitted (sweep.calibrate refuses them as free).
UNFITTED_CONSTANTS = ("gemm_plateau",)


def load_constants(path=None):
    """The fitted constants and their provenance from a TOML file.

    Returns
    -------
    tuple of (dict str -> float, dict str -> str)
    """
    source = Path(path) if path is not None else _CONSTANTS_FILE
    with source.open("rb") as handle:
        data = tomllib.load(handle)
    constants = {k: float(v) for k, v in data["constants"].items()}
    missing = set(CONSTANT_BOUNDS) - set(constants)
    if missing:
        raise ValueError(f"{path or _CONSTANTS_FILE}: missing constants {sorted(missing)}")
    return constants, {k: str(v) for k, v in data.get("provenance", {}).items()}


CONSTANTS, CONSTANTS_PROVENANCE = load_constants()

_K = knobs_.Knob
#: The knobs of :func:`solve` (name -> :class:`solver.knobs.Knob`).
KNOBS = {k.name: k for k in (
    _K("batch_size", "int", 1, low=1, why="global batch in sequences"),
    _K("seq_len", "int", 2048, low=1, why="tokens per sequence"),
    _K("tp_size", "int", 1, low=1, why="tensor-parallel degree"),
    _K("pp_size", "int", 1, low=1, why="pipeline-parallel degree"),
    _K("cp_size", "int", 1, low=1, why="context-parallel degree"),
    _K("cp_comm_type", "choice", "p2p",
       why="how the context-parallel ranks exchange the attention's inputs (Megatron-Core's "
           "cp_comm_type): 'p2p' the K/V ring overlapped with the attention, 'all_gather' "
           "K and V gathered whole, 'a2a' Ulysses' all-to-alls of Q, K, V and the output, "
           "'a2a+p2p' all-to-alls in groups of cp_a2a_size and the ring between them"),
    _K("cp_a2a_size", "int", 0, low=0, high=4095,
       why="the all-to-all group of cp_comm_type 'a2a+p2p', consecutive CP ranks (the first "
           "of Megatron-Core's hierarchical_context_parallel_sizes, the ring's cp_size over "
           "it); 0: not set"),
    _K("ep_size", "int", 1, low=1, why="expert-parallel degree (folded into DP x CP)"),
    _K("etp_size", "int", None, low=1,
       why="expert tensor-parallel degree (Megatron-Core's expert_tensor_parallel_size; "
           "None: tp_size)"),
    _K("dp_size", "int", None, low=1, why="data-parallel degree when it sizes the cluster"),
    _K("v_stages", "int", 1, low=1, why="virtual pipeline stages per device"),
    _K("micro_batch_size", "int", 1, low=1, why="sequences per microbatch"),
    _K("sequence_parallel", "bool", False),
    _K("recompute", "choice", "none"),
    _K("recompute_modules", "choice", "core_attn",
       why="what recompute='selective' recomputes (Megatron-Core's recompute_modules): "
           "'core_attn' (the attention core), 'moe_act' (the routed experts' activation), "
           "'layernorm' (the norms that are modules of their own), 'mla_up_proj' (a "
           "multi-head latent attention's up projections), 'mlp' (a dense layer's MLP), 'moe' "
           "(an MoE layer whole, its dispatch and combine too), 'shared_experts' (an MoE "
           "layer's shared experts), or several joined by ',' or '+'; read only under "
           "recompute='selective'"),
    _K("recompute_num_layers", "int", 0, low=0, high=4095,
       why="under recompute='full', Megatron-Core's recompute_num_layers: with "
           "recompute_method 'block' the layers of each pipeline chunk whose forward is "
           "recomputed, the first ones; with 'uniform' the layers of one checkpoint (every "
           "layer recomputed); 0: not set, every layer, one checkpoint each"),
    _K("recompute_method", "choice", "block",
       why="Megatron-Core's recompute_method under recompute='full': 'block' (recompute the "
           "first recompute_num_layers layers of each chunk) or 'uniform' (every layer, in "
           "checkpoints of recompute_num_layers layers)"),
    _K("zero_stage", "int", 1, low=0, high=3, why="0 DDP, 1 distributed optimizer, 2 + grads (reduce-scattered every microbatch), 3 FSDP"),
    _K("precision", "choice", "bf16"),
    _K("tp_comm_overlap", "bool", False),
    _K("overlap_grad_reduce", "bool", True),
    _K("overlap_param_gather", "bool", True),
    _K("flash_attention", "bool", True),
    _K("cross_entropy_loss_fusion", "bool", False,
       why="a fused vocabulary-parallel cross-entropy (Megatron-Core's; its kind "
           "cross_entropy_fusion_impl)"),
    _K("cross_entropy_fusion_impl", "choice", "native",
       why="the fused cross-entropy under cross_entropy_loss_fusion: 'native' (Megatron-Core's "
           "torch.compile fusion, priced as the unfused one) or 'te' (Transformer Engine's, on "
           "the 16-bit logits, its gradient written into them)"),
    _K("fp8_recipe", "choice", "delayed",
       why="Megatron-Core's fp8_recipe, read under precision='fp8': 'delayed' (its default), "
           "'tensorwise' (current scaling), 'blockwise' (FP8 blocks, Hopper and Blackwell), "
           "'mxfp8' (Blackwell): what Megatron-Core and the accelerator allow beside it, and "
           "the precision-aware optimizer's master weights; the GEMMs and casts are priced "
           "alike under every recipe"),
    _K("fp8_param_gather", "bool", False,
       why="FP8 parameters gathered in FP8 (Megatron-Core's --fp8-param-gather): under "
           "precision='fp8' with the distributed optimizer or FSDP, the parameter all-gathers "
           "move a byte a transformer-layer parameter, not two (two still under fp8_recipe "
           "'mxfp8', which gathers BF16 and casts on the copy)"),
    _K("grad_reduce_in_bf16", "bool", False),
    _K("use_precision_aware_optimizer", "bool", False,
       why="Megatron-Core's precision-aware optimizer (Transformer Engine's FusedAdam): the "
           "master weights and Adam's moments as main_params_dtype, exp_avg_dtype and "
           "exp_avg_sq_dtype set them, with the distributed optimizer or FSDP"),
    _K("main_params_dtype", "choice", "fp32",
       why="the master weights under use_precision_aware_optimizer: 'fp32' (kept as 16-bit "
           "remainders of BF16 weights under store_param_remainders) or 'fp16'; other than "
           "'fp32' only with it (Megatron-Core refuses it without)"),
    _K("exp_avg_dtype", "choice", "fp32",
       why="Adam's first moment under use_precision_aware_optimizer: 'fp32', 'fp16', 'bf16' "
           "or 'fp8'; other than 'fp32' only with it"),
    _K("exp_avg_sq_dtype", "choice", "fp32",
       why="Adam's second moment under use_precision_aware_optimizer: 'fp32', 'fp16', 'bf16' "
           "or 'fp8'; other than 'fp32' only with it"),
    _K("store_param_remainders", "bool", True,
       why="FP32 master weights of BF16 weights kept as their 16-bit remainders (Megatron-Core's "
           "default); read only under use_precision_aware_optimizer"),
    _K("fsdp_own_nic", "bool", False,
       why="ZeRO-3's collectives at one NIC's rate, as DeepSpeed's ZeRO-3 of 2021 ran them "
           "(NAR21 Table 2); off: across the domain on all its NICs (Megatron-FSDP)"),
    _K("scatter_gather_tensors_in_pipeline", "bool", False),
    _K("overlap_p2p_comm", "bool", True),
    _K("overlap_moe_expert_parallel_comm", "bool", False),
    _K("moe_shared_expert_overlap", "bool", False,
       why="an MoE layer's shared experts on a stream of their own beside the dispatcher "
           "(Megatron-Core's --moe-shared-expert-overlap): their GEMMs hide part of the "
           "dispatch and the combine, their TP pair leaves tp_comm_overlap, and their "
           "first GEMM keeps its TP-gathered input whole; a model without shared experts "
           "ignores it"),
    _K("moe_enable_deepep", "bool", False,
       why="the flex token dispatcher with DeepEP (--moe-token-dispatcher-type flex "
           "--moe-enable-deepep): a token sent once to each rank and domain holding its "
           "experts; off: the all-to-all dispatcher, one copy per routed expert"),
    _K("moe_flex_dispatcher_backend", "choice", "deepep",
       why="the flex dispatcher's backend, read with moe_enable_deepep (the flex dispatcher; "
           "Megatron-Core's --moe-flex-dispatcher-backend): 'deepep' (NVLink to 8 ranks, "
           "RDMA beyond) or 'hybridep' (NVIDIA's HybridEP: NVLink across the whole domain, "
           "an NVL72 rack)"),
    _K("moe_router_num_groups", "int", 0, low=0, high=65535,
       why="groups of experts of group-limited routing (Megatron-Core's moe_router_num_groups: "
           "node-limited routing sets it to the nodes of the EP group, device-limited to "
           "ep_size); read only with moe_router_group_topk; 0: not set"),
    _K("moe_router_group_topk", "int", 0, low=0, high=65535,
       why="groups a token's experts are chosen from (Megatron-Core's moe_router_group_topk; "
           "DeepSeek-V3: 4 of 8); 0: not set, routing over every expert"),
    _K("cpu_offloading_num_layers", "int", 0, low=0, high=4095,
       why="layers whose activations are offloaded to host memory (Megatron-Core's "
           "--cpu-offloading with --cpu-offloading-num-layers); 0: none. One pipeline stage, "
           "no recompute"),
    _K("hidden_dropout", "float", 0.1, low=0.0, high=1.0,
       why="the hidden state's dropout probability, Megatron-Core's hidden_dropout"),
    _K("attention_dropout", "float", 0.1, low=0.0, high=1.0,
       why="the attention scores' dropout probability, Megatron-Core's attention_dropout"),
    _K("mtp_num_layers", "int", 0, low=0, high=63,
       why="multi-token prediction modules on the last stage (Megatron-Core's mtp_num_layers)"),
    _K("num_layers_in_first_pipeline_stage", "int", 0, low=0, high=4095,
       why="layers of the first pipeline stage (Megatron-Core's; 0: not set, an even share)"),
    _K("num_layers_in_last_pipeline_stage", "int", 0, low=0, high=4095,
       why="layers of the last pipeline stage (Megatron-Core's; 0: not set, an even share)"),
    _K("account_for_embedding_in_pipeline_split", "bool", False),
    _K("account_for_loss_in_pipeline_split", "bool", False),
)}
#: The rules of ``realizable`` beyond whole microbatches, in words (messages name them).
REALIZABLE_RULES = (
    "heads and KV heads divisible by tp_size, layers by pp_size x v_stages (with the first "
    "or last stage's layers set: a pipeline, the other layers split evenly over the stages "
    "between, a layer or more each, and every stage's by v_stages; with "
    "account_for_embedding/loss_in_pipeline_split, the layers plus one for each by pp_size "
    "into stages of two or more, each by v_stages), seq_len by "
    "2 x cp_size (and by tp_size x cp_size under sequence_parallel), experts by ep_size, an "
    "expert's width by etp_size, an "
    "interleaved schedule's microbatches by pp_size (and, without overlap_p2p_comm, more "
    "than two stages); tp_comm_overlap and MoE with tp_size > 1 "
    "need sequence_parallel, tp_comm_overlap every TP group inside one NVLink domain, "
    "cp_size > 1 flash_attention, cp_comm_type 'a2a' cp_size dividing each TP rank's heads "
    "and KV heads, 'a2a+p2p' cp_a2a_size set, dividing cp_size and each TP rank's heads and "
    "KV heads, a multi-head latent attention cp_comm_type 'p2p', or 'a2a+p2p' with a ring "
    "(cp_a2a_size below cp_size), fp8_param_gather precision='fp8' and zero_stage >= 1, "
    "use_precision_aware_optimizer zero_stage >= 1, main_params_dtype, exp_avg_dtype and "
    "exp_avg_sq_dtype other than 'fp32' use_precision_aware_optimizer, "
    "overlap_param_gather "
    "overlap_grad_reduce, ep_size > 1 a precision other than fp16, zero_stage 2 and 3 (FSDP) "
    "pp_size 1, recompute_num_layers recompute='full', "
    "overlap_moe_expert_parallel_comm ep_size > 1, no full recompute, an "
    "interleaved schedule where pp_size > 1 and at most one MTP layer, "
    "moe_shared_expert_overlap no overlap_moe_expert_parallel_comm and (with shared "
    "experts) no 'shared_experts' recompute, moe_enable_deepep "
    "(an MoE model) etp_size x ep_size > 1, an NVIDIA Ampere, Hopper or Blackwell GPU and, "
    "with DeepEP, an NVLink domain of at most 8 GPUs, with HybridEP its group split evenly "
    "over whole domains or inside one (at most 72 and an even number of ranks a domain) "
    "and a hidden size divisible by 512, "
    "moe_router_group_topk (an MoE model) moe_router_num_groups set, dividing the experts "
    "and no smaller than it, moe_router_group_topk dividing top-k, a group holding top-k / "
    "moe_router_group_topk experts or more, and "
    "every layout a "
    "precision its accelerator has (fp8 and fp4 only where the catalog states their peak)")
#: Knob name -> default.
DEFAULTS = {name: knob.default for name, knob in KNOBS.items()}
_CHOICES = {"recompute": RECOMPUTE, "precision": PRECISIONS, "cp_comm_type": CP_COMM_TYPES,
            "cross_entropy_fusion_impl": steps.CROSS_ENTROPY_IMPLS,
            "main_params_dtype": steps.MAIN_PARAMS_DTYPES, "exp_avg_dtype": steps.MOMENT_DTYPES,
            "exp_avg_sq_dtype": steps.MOMENT_DTYPES,
            "recompute_modules": steps.RECOMPUTE_MODULE_SETS, "fp8_recipe": steps.FP8_RECIPES,
            "recompute_method": steps.RECOMPUTE_METHODS,
            "moe_flex_dispatcher_backend": steps.FLEX_BACKENDS}
#: The values of each knob of kind ``"choice"`` (name -> tuple, the codes their indices).
CHOICES = dict(_CHOICES)

#: Output name -> (CF units, long name).
OUTPUTS = {
    "valid": ("1", "split is possible: TP*PP*CP divides the fleet and the expert grid ETP*EP divides TP*CP*DP"),
    "realizable": ("1", "Megatron-Core can run it: whole microbatches, heads, KV heads [16] and experts split evenly, layers into pp_size * v_stages equal chunks or as the first and last stages' layers set [13], interleaving with the microbatches in groups of pp_size [17] (on more than two stages without overlap_p2p_comm [27]), no idle ranks, none of the flag combinations Megatron refuses [15] [18]-[20], tp_comm_overlap only with TP inside an NVLink domain [37], no ZeRO-2/3 with a pipeline [30], a precision the accelerator has [21]"),
    "dp_size": ("1", "data-parallel degree"),
    "microbatch_count": ("1", "microbatches per step per data-parallel rank"),
    "step_latency_total": ("s", "training step time"),
    "effective_throughput": ("s-1", "fleet throughput in samples per second"),
    "tokens_per_second_per_accelerator": ("s-1", "tokens per second per accelerator"),
    "model_flops_per_accelerator": ("s-1", "model FLOPs per second per accelerator (Megatron-LM's count of NAR21 eq. 3, attention scores dense; Megatron-LM since 2025 halves them for the causal mask, printing 6.7 % less at Llama-3-70B seq_len 8192)"),
    "mfu": ("1", "model FLOPs utilization against the dense peak at the GEMM precision"),
    "hfu": ("1", "hardware FLOPs utilization (recomputation included)"),
    "compute_latency": ("s", "busy time of the heaviest stage (GEMMs, attention, memory-bound kernels)"),
    "tp_communication_latency": ("s", "exposed tensor-parallel collectives"),
    "cp_communication_latency": ("s", "exposed context-parallel exchange: the K/V ring, the all-gathers of K and V, the all-to-alls of Q, K, V and the output, or both of the hierarchical kind (cp_comm_type)"),
    "ep_communication_latency": ("s", "expert dispatch left exposed: the expert-parallel all-to-all and, with expert tensor parallelism (etp_size > 1, by default tp_size), the dispatcher's all-gather and reduce-scatter over the expert TP group, so nonzero at ep_size 1 where etp_size > 1 (all of it but what overlap_moe_expert_parallel_comm hides behind the paired microbatch's work)"),
    "pp_communication_latency": ("s", "exposed pipeline p2p sends"),
    "dp_communication_latency": ("s", "exposed data-parallel gradient reduction and parameter gather"),
    "communication_latency": ("s", "all communication before overlap"),
    "pipeline_bubble_latency": ("s", "pipeline fill and drain"),
    "bubble_fraction": ("1", "idle share of the pipelined step"),
    "optimizer_latency": ("s", "optimizer step"),
    "launch_latency": ("s", "host kernel-launch time the paced stage's GPU work does not hide (layer_overhead: where a layer's launches outlast its GPU work)"),
    "memory_footprint": ("byte", "training memory per accelerator (of the pipeline rank that holds the most; the memory parts are that rank's, so a part may rise where the footprint falls, the peak moving to another rank): the memory terms, the optimizer step's FP32 copies (of 16-bit gradients; of a precision-aware optimizer's narrower states) counted only where they outweigh the activations and buffers they never coexist with"),
    "memory_weights": ("byte", "weights per accelerator, of the pipeline rank memory_footprint prices"),
    "memory_gradients": ("byte", "gradients per accelerator, of the pipeline rank memory_footprint prices"),
    "memory_optimizer_state": ("byte", "optimizer state per accelerator (and the step's FP32 copies: of 16-bit gradients, of a precision-aware optimizer's narrower states), of the pipeline rank memory_footprint prices"),
    "memory_activations": ("byte", "stored activations per accelerator, of the pipeline rank memory_footprint prices"),
    "memory_communication_buffers": ("byte", "gradient buckets, p2p and gather buffers per accelerator, of the pipeline rank memory_footprint prices"),
    "offload_latency": ("s", "host-link copies of the offloaded activations (cpu_offloading_num_layers) the layers' work does not hide: to the host in the forward, back in the backward"),
    "feasible": ("1", "training state fits the accelerator's memory"),
}


# ------------------------------------------------------------------ knobs

def _codes(name, value):
    """Integer codes into :data:`_CHOICES` [name] for a string or array of strings."""
    choices = _CHOICES[name]

    def code(v):
        key = str(v).lower() if isinstance(v, (str, np.str_)) else None
        if name == "recompute_modules" and key is not None:
            key = steps.recompute_module_set(key)  # (its modules in any order; or ValueError)
        if key not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, but got {v!r}")
        return choices.index(key)

    if isinstance(value, (str, np.str_)):
        return np.int64(code(value))
    array = knobs_._array(KNOBS[name], value)
    if array.dtype.kind not in "UO":
        raise ValueError(f"{name} must be a string or an array of strings, but got {value!r:.80}")
    raw, codes = knobs_._factorize(array)
    table = np.array([code(v) for v in raw], dtype=np.int64)
    return table[codes]


def _choice_codes(name, value, fk=None):
    """:func:`_codes`, through the one-pass match of ``fk`` (the fused kernel's module) where given."""
    codes = fk.factorize_choices(value, _CHOICES[name]) if fk is not None else None
    return codes if codes is not None else _codes(name, value)


#: Integer knobs the fused kernel receives packed into a byte (megatron_kernel.pipeline_flags),
#: or does not read (recompute_num_layers: _beside_kernel), so their range is checked
#: before it, never left to its first pass.
_PACKED_KNOBS = ("mtp_num_layers", "num_layers_in_first_pipeline_stage",
                 "num_layers_in_last_pipeline_stage", "recompute_num_layers", "cp_a2a_size",
                 "moe_router_num_groups", "moe_router_group_topk")
#: Knobs the fused kernel does not read: the configurations that set them where they
#: matter are priced on the numpy path beside it (:func:`_beside_kernel`).
_BESIDE_KERNEL = ("recompute_num_layers", "cp_comm_type", "cp_a2a_size", "fp8_param_gather",
                  "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
                  "use_precision_aware_optimizer", "main_params_dtype", "exp_avg_dtype",
                  "exp_avg_sq_dtype", "store_param_remainders", "moe_router_num_groups",
                  "moe_router_group_topk", "recompute_modules", "fp8_recipe", "recompute_method",
                  "moe_shared_expert_overlap", "moe_flex_dispatcher_backend",
                  "cpu_offloading_num_layers")


def _normalize(values, fast=False, unchecked=None):
    """The knobs checked and converted (int64, bool, int64 codes of the choices).

    ``fast``: big 1-D arrays that are already right (int64 in bounds, exact choice names)
    pass in one numba pass each (:mod:`solver.fused.megatron_kernel`); anything else, and
    every error message, goes through the checking converters. ``unchecked``: a list
    that, where given, takes the names of big int64 arrays passed on with their range
    checks left to the fused kernel (its first pass reads them anyway), and of big 1-D
    arrays of names of up to 9 characters passed on as names, for that pass to match;
    whoever prices them otherwise checks and converts them first (:func:`_check_deferred`).
    """
    fk = None
    if fast:
        if fused.NUMBA and any(np.ndim(v) == 1 and np.size(v) >= FUSED_MIN_POINTS
                               for v in values.values()):
            from ..fused import megatron_kernel as fk
    out = {}
    for name, value in values.items():
        knob = KNOBS[name]
        big = fk is not None and isinstance(value, np.ndarray) and value.ndim == 1 \
            and value.size >= FUSED_MIN_POINTS
        if knob.kind == "choice" and big and unchecked is not None \
                and name not in _BESIDE_KERNEL and fk.name_characters(value) is not None:
            out[name] = value  # matched exactly in the fused kernel's first pass
            unchecked.append(name)
        elif knob.kind == "choice":
            out[name] = _choice_codes(name, value, fk if big else None)
        elif big and knob.kind == "int" and unchecked is not None and value.dtype == np.int64 \
                and name not in _PACKED_KNOBS:
            out[name] = value
            unchecked.append(name)
        elif big and knob.kind == "int" and fk.int_in_bounds(value, knob.low, knob.high,
                                                              knobs_.MAX_INTEGER):
            out[name] = value
        else:
            out[name] = knobs_._CONVERT[knob.kind](knob, value)
    return out


_FIRST, _LAST = "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"


def _account_stages(w, k):
    """``k`` with ``account_for_embedding/loss_in_pipeline_split`` [36] made the set stages
    they amount to, and ``"pipeline_split"`` where either is on: 1 where Megatron-Core's
    rule holds (the layers plus one for each split into ``pp_size`` equal stages, each a
    multiple of ``v_stages``; the first / last stage's layers are then that share less one,
    and the ``layers`` rule holds), 2 where it does not or a stage's layers are set too
    (which Megatron-Core refuses; the stages are left as given, so the layout is priced as
    the even split or the set stages; ``layers`` is broken), 0 where the flags do not apply
    (no pipeline and no stage set). Without either flag on: ``k`` without them, no work.
    A share of one layer (a stage of the embedding or the loss alone) is taken as broken:
    this model prices no stage of no layers. The flags leave ``k`` either way (the kernel
    takes the stages and the rule's outcome)."""
    emb = k.pop("account_for_embedding_in_pipeline_split", False)
    loss = k.pop("account_for_loss_in_pipeline_split", False)
    if not (np.any(emb) or np.any(loss)):
        return k
    e, l = np.asarray(emb, dtype=np.int64), np.asarray(loss, dtype=np.int64)
    pp, v = np.maximum(k["pp_size"], 1), np.maximum(k["v_stages"], 1)  # (bounds checked later)
    first, last = k[_FIRST], k[_LAST]
    flagged, staged = (e | l) == 1, (first > 0) | (last > 0)
    on = flagged & (pp > 1) & ~staged
    total = w.layers + e + l
    share = total // pp
    holds = (total % pp == 0) & (share % v == 0) & (share > 1) & (share <= 4096)
    set_ = on & holds
    k[_FIRST] = np.where(set_ & (e == 1), share - e, first)
    k[_LAST] = np.where(set_ & (l == 1), share - l, last)
    k["pipeline_split"] = np.where(flagged & staged, 2,
                                   np.where(on, np.where(holds, 1, 2), 0)).astype(np.int64)
    return k


def _constants(overrides):
    out = dict(CONSTANTS)
    for name, value in overrides.items():
        if name not in CONSTANT_BOUNDS:
            raise TypeError(f"solve() got an unexpected keyword argument {name!r} (knobs: "
                            f"{', '.join(KNOBS)}; constants: {', '.join(CONSTANT_BOUNDS)})")
        low, high, why = CONSTANT_BOUNDS[name]
        array = np.asarray(value, dtype=np.float64)
        if array.ndim == 0:  # one number (a fit's every call): checked without reductions
            x = float(array)
            if math.isfinite(x) and low <= x <= high:
                out[name] = array
                continue
        if not np.all(np.isfinite(array)) or np.any(array < low) or np.any(array > high):
            bad = array[~(np.isfinite(array) & (array >= low) & (array <= high))].flat[0] \
                if array.ndim else array
            raise ValueError(f"{name} must be a number in [{low:g}, {high:g}] ({why}), "
                             f"but got {name}={float(bad)!r}")
        out[name] = array
    return out


# ------------------------------------------------------------------ shape

class ShapeWarning(UserWarning):
    """The shape the megatron physics prices a workload by is not the model it declares.

    The megatron physics counts FLOPs, weights and traffic from the shape (layers, hidden
    width, heads, KV heads, FFN width, vocabulary, experts), filling what a workload omits
    with Megatron's defaults; the mlsysim physics prices the declared ``parameters``. Where
    the shape's parameter count is more than :data:`SHAPE_TOLERANCE` off the declared one
    with a field defaulted (a catalog entry written for the mlsysim physics, as
    ``Llama3_70B``: its shape lacks GQA's KV heads, the SwiGLU width and the vocabulary,
    and comes to 64.8B of 70.6B), or more than 2x off with every field given (a unit slip
    in a catalog of one's own), the two models price different models, and this says so.
    """


#: The share a shape's parameter count may stray from the declared ``parameters`` where a
#: shape field takes Megatron's default (the ``*_MC`` entries, every field given, come
#: within 0.2 %; a full shape may differ up to 2x, by its embeddings' convention).
SHAPE_TOLERANCE = 0.05

#: The shape fields a workload gives the megatron physics (MoE's where it has experts).
_SHAPE_FIELDS = ("hidden_dim", "heads", "kv_heads", "ffn_hidden_dim", "vocab_size", "gated_mlp")
_MOE_FIELDS = ("moe_ffn_hidden_dim", "active_experts_per_token", "shared_experts")


def check_shape(workload: Workload) -> None:
    """Warn (:class:`ShapeWarning`) if the shape the megatron physics would price
    ``workload`` by is not the model it declares; :func:`solve`, :func:`prepare` and
    :func:`why_unrealizable` do (``check_shape=False`` skips it: a sweep checks each of its
    workloads once, before its blocks); ValueError for a workload that is no transformer
    (:func:`_check_kind`)."""
    _check_kind(workload)
    _check_shape(workload, _Shape(workload))


def _check_shape(w: Workload, shape) -> None:
    """:class:`ShapeWarning` where ``shape``'s parameter count strays from ``w``'s declared one
    (a workload of no stated shape at all, priced as 12 L h^2 = N, is taken as meant)."""
    if not (w.hidden_dim and w.heads):
        return
    total = shape.parameter_counts()[0]
    # the declared count by any convention of the embeddings: without them, with one matrix
    # or two (published counts differ: NAR21's 1.7B is its shape's 1.8B without the 0.12B
    # embedding)
    emb = shape.embedding_params
    closest = min((count / float(w.parameters) for count in (total - emb, total, total + emb)),
                  key=lambda r: abs(math.log(r)) if r > 0 else math.inf)
    ratio = total / float(w.parameters)
    fields = _SHAPE_FIELDS + (_MOE_FIELDS if shape.moe else ())
    defaulted = [f for f in fields if getattr(w, f, None) is None
                 and not (f == "kv_heads" and shape.mla)]
    if (defaulted and abs(closest - 1.0) > SHAPE_TOLERANCE) or not 0.5 <= closest <= 2.0:
        why = (f"{', '.join(defaulted)} {'is' if len(defaulted) == 1 else 'are'} not given and "
               f"take{'s' if len(defaulted) == 1 else ''} Megatron's defaults (KV heads = heads, "
               f"FFN width 4 x hidden, no gated MLP, a {DEFAULT_VOCAB:,}-token vocabulary"
               + (", experts as wide as it, top-1 routing, no shared expert" if shape.moe else "")
               + ")"
               if defaulted else "every shape field is given, so the declared count is likely "
               "wrong (a unit slip?) or the shape is")
        full = _full_shape_entry(w) if defaulted else None
        hint = f"; the catalog's {full!r} has the full shape" if full else ""
        warnings.warn(
            f"workload {w.name!r}: the megatron physics prices the {_count(total)} "
            f"parameters of its shape, {ratio:.2f}x its declared {_count(w.parameters)}, "
            f"so it prices another model than the one declared (the mlsysim physics prices "
            f"the declared count): {why}{hint}",
            ShapeWarning, stacklevel=caller_stacklevel())


def _count(n) -> str:
    """A parameter count as people write it: 64.8B, 120M."""
    n = float(n)
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _full_shape_entry(w):
    """The catalog's ``<key>_MC`` entry for the catalog workload ``w`` (None if there is none)."""
    from .. import catalog
    key = catalog.key_of("workloads", w)
    return f"{key}_MC" if key is not None and f"{key}_MC" in catalog.names("workloads") else None


class _Shape:
    """The workload's transformer shape, with Megatron's defaults for what it omits."""

    def __init__(self, w: Workload):
        if w.layers is None or w.parameters is None:
            raise ValueError(f"workload {w.name!r}: the megatron physics needs layers and parameters")
        self.layers = int(w.layers)
        if w.hidden_dim and w.heads:
            self.hidden, self.heads = int(w.hidden_dim), int(w.heads)
        else:  # no shape: 12 L h^2 = N (then FLOPs are about 6 N per token)
            self.hidden = int(round(math.sqrt((w.active_parameters or w.parameters) / (12 * self.layers))))
            self.heads = max(1, self.hidden // 128)
        h = self.hidden
        self.kv_heads = int(w.kv_heads or self.heads)
        self.head_dim = float(w.head_dim or h / self.heads)
        self.gated = bool(w.gated_mlp)
        self.ffn = float(w.ffn_hidden_dim or 4 * h)
        self.vocab = float(w.vocab_size or (DEFAULT_VOCAB if w.hidden_dim else 0))
        self.moe = bool(w.experts and w.experts > 1)
        self.experts = int(w.experts or 1)
        self.top_k = float(w.active_experts_per_token or 1) if self.moe else 0.0
        self.moe_ffn = float(w.moe_ffn_hidden_dim or self.ffn)
        self.shared = float(w.shared_experts or 0)
        self.dense_layers = int(w.dense_layers or 0) if self.moe else self.layers
        self.moe_layers = self.layers - self.dense_layers
        mats = 3.0 if self.gated else 2.0
        self.mla = w.kv_lora_rank is not None
        if self.mla:  # multi-head latent attention [33]
            self.kv_heads = self.heads  # no grouping: every head its own key and value
            self.q_lora = float(w.q_lora_rank or 0)  # 0: queries projected directly
            self.kv_lora, self.rope = float(w.kv_lora_rank), float(w.qk_rope_head_dim)
            self.qk_dim = float(w.qk_nope_head_dim) + self.rope
            self.head_dim = float(w.v_head_dim)  # the output projection's width per head
            q_params = (self.q_lora * (h + self.heads * self.qk_dim + 1) if self.q_lora
                        else h * self.heads * self.qk_dim)
            # q and kv down and up projections with their norms' weights, the output projection
            attn = (q_params + h * self.rope
                    + self.kv_lora * (h + self.heads * (float(w.qk_nope_head_dim) + self.head_dim) + 1)
                    + self.heads * self.head_dim * h)
            # The core's mean of its key and value widths (QK^T at qk_dim, PV at v): its FLOPs
            # and its K/V bytes are those of plain attention of this head width.
            self.core_dim = (self.qk_dim + self.head_dim) / 2.0
            # What the up projections all-gather over TP (SP) or all-reduce (backward),
            # where a GQA layer moves h: the latents and the positional key (h itself for
            # queries projected directly).
            self.attn_pair = (h + (self.q_lora or h) + self.kv_lora + self.rope) / (2.0 * h)
            # Activations kept [bytes per token over h]: Q and K (qk_dim), V and the output
            # projection's input (v), 2 bytes each, split by TP with the heads; the latents
            # (norm input and output of each, and the positional key), with the norms
            # inputs replicated over TP unless SP splits the sequence.
            self.attn_act = 4.0 * self.heads * (self.qk_dim + self.head_dim) / h
            self.latent_act = (4.0 * (self.q_lora + self.kv_lora) + 2.0 * self.rope) / h
            # Under FP8 [6] the up projections keep the latents' norm outputs in one byte,
            # and the layer's norm output is kept once more: each down projection (a
            # TELinear of its own [33]) keeps its own FP8 copy of it, where GQA's fused
            # norm and QKV keep one.
            self.latent_act_fp8 = (3.0 * (self.q_lora + self.kv_lora) + 2.0 * self.rope) / h + 1.0
            # The down projections and the latents' norms, ``duplicated`` [33]: whole on
            # every TP rank (the rest of the layer's weights split over TP).
            self.attn_dup = ((self.q_lora * (h + 1) if self.q_lora else 0.0)
                             + h * (self.kv_lora + self.rope) + self.kv_lora)
        else:
            self.q_lora = self.kv_lora = self.rope = 0.0
            self.qk_dim = self.core_dim = self.head_dim
            attn = h * self.head_dim * (self.heads + 2 * self.kv_heads) + self.heads * self.head_dim * h
            self.attn_pair = 1.0
            # Table 2 of Korthikanti et al.: Q, K, V and the output projection's input, 2 bytes
            # each, at their widths (a h, kv d, kv d, a d) over h
            self.attn_act = 4.0 * (self.heads * self.head_dim + self.kv_heads * self.head_dim) / h
            self.latent_act = self.latent_act_fp8 = 0.0
            self.attn_dup = 0.0
        self.attn_params = attn
        # the output projection's input width over h (kept in one byte under FP8)
        self.context_ratio = self.heads * self.head_dim / h
        self.dense_layer_params = attn + mats * h * self.ffn + 2 * h
        self.expert_params = mats * h * self.moe_ffn
        self.moe_layer_nonexpert = attn + 2 * h + h * self.experts + self.shared * self.expert_params
        # A layer's weights whole on every TP rank: its two norms' (Transformer Engine's
        # LayerNormLinear keeps the norm's weight replicated) and MLA's duplicated ones [33];
        # an MoE layer's router too (one experts x h tensor, replicated [31]).
        self.dense_dup = self.attn_dup + 2.0 * h
        self.moe_dup = self.dense_dup + h * self.experts
        self.embedding_params = self.vocab * h
        # A multi-token prediction module's weights besides its transformer layer [34]: the
        # projection (2h -> h) and three norms (of the embedding, the hidden state, the output).
        self.mtp_module_params = 2.0 * h * h + 3.0 * h
        # One pipeline stage holds the input embedding and, untied, the output layer too [22].
        tied = True if w.tied_embeddings is None else bool(w.tied_embeddings)
        self.single_stage_embedding = self.embedding_params * (1.0 if tied else 2.0)
        #: embedding matrices on the one stage of an unpipelined model (the output layer's too
        #: where untied)
        self.embedding_copies = 1.0 if tied else 2.0

    def parameter_counts(self):
        """(total, active) parameters of the shape: its layers, dense and MoE (every expert;
        the top-k and shared ones a token meets), and one embedding matrix if tied, two if not."""
        dense = self.dense_layer_params * self.dense_layers
        total = dense + (self.moe_layer_nonexpert + self.expert_params * self.experts) * self.moe_layers
        active = dense + (self.moe_layer_nonexpert + self.expert_params * self.top_k) * self.moe_layers
        return float(total + self.single_stage_embedding), float(active + self.single_stage_embedding)


# ------------------------------------------------------------------- solve

def solve(workload: Workload, fleet: Fleet, *, batch_size=1, seq_len=2048, tp_size=1, pp_size=1,
          cp_size=1, ep_size=1, dp_size=None, etp_size=None, v_stages=1, micro_batch_size=1,
          cp_comm_type="p2p", cp_a2a_size=0,
          sequence_parallel=False, recompute="none", recompute_modules="core_attn",
          recompute_num_layers=0, recompute_method="block", zero_stage=1,
          precision="bf16",
          tp_comm_overlap=False, overlap_grad_reduce=True, overlap_param_gather=True,
          flash_attention=True, cross_entropy_loss_fusion=False,
          cross_entropy_fusion_impl="native", fp8_recipe="delayed", fp8_param_gather=False,
          grad_reduce_in_bf16=False,
          use_precision_aware_optimizer=False, main_params_dtype="fp32", exp_avg_dtype="fp32",
          exp_avg_sq_dtype="fp32", store_param_remainders=True, fsdp_own_nic=False,
          scatter_gather_tensors_in_pipeline=False, overlap_p2p_comm=True,
          overlap_moe_expert_parallel_comm=False, moe_shared_expert_overlap=False,
          moe_enable_deepep=False, moe_flex_dispatcher_backend="deepep", moe_router_num_groups=0, moe_router_group_topk=0, cpu_offloading_num_layers=0,
          hidden_dropout=0.1,
          attention_dropout=0.1, mtp_num_layers=0,
          num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0,
          account_for_embedding_in_pipeline_split=False,
          account_for_loss_in_pipeline_split=False, engine="auto", check_shape=True,
          **constants):
    """Megatron-Core training step of ``workload`` on ``fleet``, for every configuration at once.

    Every knob may be an array; all broadcast together (pass a grid as an
    open mesh, like ``np.ix_``: each term is computed on the axes it spans).

    Parameters
    ----------
    workload : solver.specs.Workload
        A transformer or MoE; its optional shape fields (``kv_heads``,
        ``ffn_hidden_dim``, ``vocab_size``, ``gated_mlp``, ``moe_ffn_hidden_dim``,
        ``shared_experts``, ...) refine the FLOPs and memory.
    fleet : solver.specs.Fleet
    batch_size : int [1]
        Global batch in sequences.
    seq_len : int [1]
    tp_size, pp_size, cp_size, ep_size : int [1]
        Tensor, pipeline, context and expert-parallel degrees. EP is folded
        into DP x CP [6]: it must divide ``dp_size * cp_size`` (with ``etp_size``, ``etp_size
        * ep_size`` must divide ``tp_size * cp_size * dp_size``).
    cp_comm_type : {"p2p", "all_gather", "a2a", "a2a+p2p"}
        How the ``cp_size`` ranks of a context-parallel group exchange the attention's
        inputs, Megatron-Core's ``cp_comm_type`` [42]: ``"p2p"`` (default, Megatron's)
        passes K and V around a ring, each step beside a step's attention; ``"all_gather"``
        gathers K and V whole before it (Llama 3's way), exposed; ``"a2a"`` trades the
        sequence's slice for the heads' with all-to-alls of Q, K, V and the output
        (Ulysses), exposed, and needs ``cp_size`` to divide each TP rank's heads and KV
        heads. ``"a2a+p2p"`` (hierarchical CP) runs the all-to-alls in groups of
        ``cp_a2a_size`` consecutive CP ranks and the ring between the groups. A multi-head
        latent attention runs ``"p2p"``, or ``"a2a+p2p"`` with a ring (``cp_a2a_size`` below
        ``cp_size``; TE runs one group of all the CP ranks as ``"a2a"``), only. Nothing at ``cp_size=1``.
        Configurations that set another at ``cp_size > 1`` are priced on the numpy path, in
        a call of the fused kernel too (the same bits either way).
    cp_a2a_size : int [1]
        Under ``cp_comm_type="a2a+p2p"``, the all-to-all group's CP ranks, the first of
        Megatron-Core's ``hierarchical_context_parallel_sizes`` (the ring's, the second,
        is ``cp_size`` over it): it must be set, divide ``cp_size`` and each TP rank's heads
        and KV heads [42]. Read under that kind only; 0 (default): not set.
    etp_size : int [1], optional
        Expert tensor-parallel degree, Megatron-Core's ``expert_tensor_parallel_size``
        (``--expert-tensor-parallel-size``) [6]: the routed experts split over ``etp_size``
        ranks, the expert grid ``etp x ep x edp x pp`` (``etp_size * ep_size`` must divide
        ``tp_size * cp_size * dp_size``). None (default): ``tp_size``, as Megatron-Core's.
        A dense model has no experts to split (the grid's rule still holds).
    dp_size : int [1], optional
        Data-parallel degree. If given, the cluster is ``tp*pp*cp*dp``
        accelerators of the fleet's node type; else ``dp`` is derived from the
        fleet's accelerators (``total / (tp*pp*cp)``, which must be whole).
    v_stages : int [1]
        Virtual (interleaved) stages per device.
    micro_batch_size : int [1]
        Sequences per microbatch; ``microbatch_count = batch / (dp * mbs)``,
        which must be whole (else ``realizable`` is False).
    sequence_parallel : bool
    recompute : {"none", "selective", "full"}
    recompute_modules : str
        What ``recompute="selective"`` recomputes (Megatron-Core's ``recompute_modules``)
        [47]: ``"core_attn"`` (default, Megatron-Core's), the attention core (QK^T, softmax,
        PV: its scores and output are not kept); ``"moe_act"``, the routed experts'
        activation, whose output (their second GEMM's input) is discarded after that GEMM
        and computed again before its backward; ``"layernorm"``, likewise the outputs of the
        norms that are modules of their own: an MoE layer's pre-MLP norm and a multi-head
        latent attention's input norm (the others are fused into the next linear layer, and
        Megatron-Core leaves them alone: on a dense model without MLA it changes nothing);
        ``"mla_up_proj"``, a multi-head latent attention's up projections and RoPE, whose Q,
        K and V are discarded once the attention core has run and computed again before its
        backward (its GEMMs, the latents' norms and RoPE, and under SP the latents'
        all-gathers), every layer's (without MLA not realizable: Megatron-Core refuses it);
        ``"mlp"``, a dense layer's MLP
        (an MoE layer's is left alone), ``"moe"``, an MoE layer whole (shared experts,
        router, dispatch, experts, combine: its dispatcher's exchanges run again),
        ``"shared_experts"``, an MoE layer's shared experts: checkpoints that keep their
        input and free what runs inside them (the dense MLP its fused norm's output too,
        the MoE layer its routed copies), their forward run again before their backward
        (with their TP pair and their FLOPs in ``hfu``); nested as Megatron-Core nests
        them (inside the MoE layer's checkpoint, the shared experts' runs them twice more,
        three times in all, and "moe_act" the activation likewise). ``"moe"`` beside
        ``overlap_moe_expert_parallel_comm`` is not realizable, whatever ``recompute``
        (Megatron-Core refuses it). Several join by ``","`` (or ``"+"``), in any order, in one string:
        ``"moe_act,layernorm"`` (Megatron-Core's list; a list or array here is an axis of
        sets, one a configuration). Under FP8, "moe_act" and "layernorm" need an
        ``fp8_recipe`` other than delayed scaling (Megatron-Core refuses them beside it: not
        realizable). Read under selective recompute only;
        a name the model does not know (Megatron-Core's seven of 2025) is refused
        (ValueError, naming it). Configurations that
        set other than ``"core_attn"`` under selective recompute are priced on the numpy
        path, in a call of the fused kernel too.
    recompute_num_layers : int [40]
        Under ``recompute="full"``, how many layers of each pipeline chunk (a stage, or
        each of its ``v_stages`` chunks) recompute their forward: the first ones, as
        Megatron-Core's ``--recompute-method block --recompute-num-layers`` runs them
        [40]; the chunk's other layers store their activations as without recompute (no
        selective recompute). More than a chunk's layers: all of them. 0 (default, not
        set): every layer. Set with another ``recompute``, not realizable (Megatron-Core
        refuses it beside selective). The configurations that set it under full
        recompute are priced on the numpy path, in a call of the fused kernel too (the
        rest there, the same bits either way). In a chunk that holds dense and MoE layers
        the recomputed ones are its first, the dense ones, in memory; in time every layer
        of a stage is priced at its mix of the two kinds, recomputed or not. MTP modules
        run plain under it (Megatron-Core's block method skips them), and a chunk's plain
        layers, its last, free their activations before its first recomputed forward.
        Under ``recompute_method="uniform"``, the layers of one checkpoint instead.
    recompute_method : {"block", "uniform"}
        Megatron-Core's ``--recompute-method`` under ``recompute="full"`` [40]: ``"block"``
        (default) as above; ``"uniform"``, every layer recomputed, each chunk's in
        checkpoints of ``recompute_num_layers`` layers (``_checkpointed_forward``), each
        keeping its first layer's input: a chunk of ``c`` layers stores ``c / n`` inputs a
        microbatch, and a checkpoint's backward holds what its ``n`` layers store without
        recompute (the heavier kind's, each, where the rank holds dense and MoE layers),
        beside the checkpoints. Time and FLOPs as full recompute of every layer. With 0 or
        1 layers, the same as ``"block"`` with 0. Not realizable where ``n > 1`` does not
        divide every chunk's layers (Megatron-Core's checkpoints index past the chunk's
        last layer) or beside MTP layers ("recompute_num_layers must be 1 for MTP
        recompute"), nor under selective recompute or beside
        ``overlap_moe_expert_parallel_comm`` (Megatron-LM refuses a method there); its
        layouts with ``recompute_num_layers`` set under full recompute are priced on the
        numpy path, in a call of the fused kernel too.
    zero_stage : {0, 1, 2, 3}
        0 DDP, 1 distributed optimizer, 2 also gradients, 3 FSDP.
    precision : {"bf16", "fp16", "fp8", "fp4"}
        Of the GEMMs; FP8/FP4 apply to GEMMs only.
    tp_comm_overlap, overlap_grad_reduce, overlap_param_gather : bool
        Under ZeRO-3, ``overlap_param_gather`` prefetches the gathers behind the whole
        compute; without it they block and ``overlap_grad_reduce`` hides only the
        gradient reduce-scatter, behind the backward [29].
    flash_attention : bool
        Fused causal attention kernel (False: unfused softmax, as Megatron-LM
        ran before 2023).
    cross_entropy_loss_fusion : bool
    cross_entropy_fusion_impl : {"native", "te"}
        Megatron-Core's fused vocabulary-parallel cross-entropy [44] (Megatron-Bridge's
        ``GPTModelProvider`` turns the fusion on; its Llama 3 recipes pick ``"te"``).
        ``"te"``: Transformer Engine's, on the 16-bit logits, 10 bytes through HBM a logit
        (an online-softmax pass, a loss pass writing the gradient into the logits, the
        backward's scaling in place) against the unfused one's 52, and the last rank holds
        the 16-bit logits, its gradient in them, not an FP32 copy. ``"native"``
        (Megatron-Core's ``torch.compile`` fusion) keeps the FP32 softmax as the unfused one
        does, and is priced as it (its bytes depend on what the compiler fuses). Layouts
        with TE's are priced on the numpy path, in a call of the fused kernel too.
    fp8_recipe : {"delayed", "tensorwise", "blockwise", "mxfp8"}
        Megatron-Core's ``fp8_recipe`` [48], read under ``precision="fp8"``: Transformer
        Engine's delayed scaling (``"delayed"``, Megatron-Core's default), current scaling
        (``"tensorwise"``), FP8 blocks of 128 (``"blockwise"``, DeepSeek-V3's) or MXFP8
        (``"mxfp8"``, NVIDIA's Blackwell recipes). It decides what runs beside FP8:
        ``"mxfp8"`` needs a Blackwell accelerator and ``"blockwise"`` a Hopper or Blackwell
        one (the catalog's ``architecture``; else not realizable); under ``"delayed"``
        ``recompute_modules`` "moe_act" and "layernorm" are not realizable (Megatron-Core
        refuses them), and the precision-aware optimizer keeps FP32 master weights in
        Transformer Engine's FusedAdam (as remainders of BF16 parameters), where under the
        other recipes Megatron-Core keeps its own FP32 copy and the gradients'. The GEMMs,
        the casts and the stored activations are priced alike under every recipe (the
        scales of the block recipes, a byte or four per 32 or 128 elements, are not
        counted; the FP8 runs of benchmarks/data/ ran delayed scaling). Configurations that
        set a block recipe under FP8 are priced on the numpy path, in a call of the fused
        kernel too.
    fp8_param_gather : bool
        Megatron-Core's ``--fp8-param-gather`` [43]: the transformer layers' weights built as
        FP8 tensors and all-gathered in FP8, a byte a parameter, by the distributed
        optimizer (``zero_stage`` 1, 2) and FSDP (3); the embedding and output matrices stay
        16-bit. Needs ``precision="fp8"`` and ``zero_stage >= 1`` (else not realizable). The
        weights' memory is priced as without it, two bytes a parameter: the FP8 weight and
        the FP8 transpose Transformer Engine keeps for its backward (where the 16-bit
        weights are kept without it, and their FP8 casts are not counted). Configurations
        that set it are priced on the numpy path, in a call of the fused kernel too.
    grad_reduce_in_bf16 : bool
        Gradients accumulated and reduced in BF16 (Megatron-LM's
        ``--grad-reduce-in-bf16``, ``grad_reduce_in_fp32=False`` in Megatron-Core,
        ``grad_sync_dtype: bf16`` in NeMo) [25]: 2 B per parameter in the buffer and
        on the wire instead of FP32's 4, and the optimizer's FP32 copy of its shard.
        False (default): FP32, Megatron-LM's default for BF16 and FP8 training. FP16
        training reduces FP16 gradients either way. (Megatron-Core's ``main_grads_dtype``
        "bf16" is this: it refuses it beside FP32 accumulation.)
    use_precision_aware_optimizer : bool
    main_params_dtype : {"fp32", "fp16"}
    exp_avg_dtype, exp_avg_sq_dtype : {"fp32", "fp16", "bf16", "fp8"}
    store_param_remainders : bool
        Megatron-Core's precision-aware optimizer [45] (Transformer Engine's FusedAdam), with
        the distributed optimizer or FSDP (``zero_stage >= 1``; else not realizable, and
        priced as without it). Adam's moments are ``exp_avg_dtype`` and
        ``exp_avg_sq_dtype`` wide (4, 2, 2, 1 bytes); the master weights ``main_params_dtype``
        (4, 2), but FP32 ones of BF16 weights (BF16 and FP4 training) 2 under
        ``store_param_remainders`` (default True, Megatron-Core's). FusedAdam reads 16-bit
        gradients as they are: no FP32 copy of them. Under FP8 with FP32 master weights
        Megatron-Core keeps its own FP32 copy and the gradients' (every ``fp8_recipe`` but
        delayed scaling, Megatron-Core's default: under it FusedAdam keeps them, as
        remainders of BF16 parameters, whole for FP8 ones). The step's
        bytes through HBM: FP32 states as Adam's; both moments BF16 updated in place (4
        bytes each, against 8); an FP16 state (moment or master weights) 40, an FP8 one 22
        and a BF16 one beside another kind 20, through FP32 copies that the step holds for
        all its states at once (4 bytes a state a parameter in ``memory_optimizer_state``,
        and in the footprint where they outweigh the activations, as the FP32 copy of 16-bit
        gradients is): so FP16 master weights with FP8 moments hold the least state (4 bytes)
        but take the longest step (90 bytes against 30). The dtypes other than ``"fp32"``
        need ``use_precision_aware_optimizer`` (Megatron-Core asserts it; else not
        realizable), and ``store_param_remainders`` is read only with it. Configurations
        that use it are priced on the numpy path, in a call of the fused kernel too.
    fsdp_own_nic : bool
        ZeRO-3's gathers and reduce-scatters as one flat ring per rank over its own NIC,
        as DeepSpeed's ZeRO-3 of 2021 ran them (NAR21 Table 2) [38]. False (default):
        inside the NVLink domain and then across it on all the domain's NICs, as the
        other data-parallel collectives (Megatron-FSDP, PyTorch FSDP2; NCCL spreads a
        collective's rings over the node's NICs [38]). The same where the group lies
        inside one domain; other ZeRO stages ignore it.
    scatter_gather_tensors_in_pipeline : bool
        Legacy Megatron-LM's pipeline sends of ``1/tp`` of the activations, all-gathered
        over NVLink on arrival (its default; [1] Sec. 4.1) [26]. False (default):
        Megatron-Core, whose sends are split by TP only under sequence parallelism.
    overlap_p2p_comm : bool
        The interleaved schedule's pipeline sends overlapped with the next chunk's
        compute (Megatron-LM's default; ``--no-overlap-p2p-communication`` turns it off,
        and Megatron-LM before 2023 had no overlap) [27]. False: each microbatch and
        chunk waits on its exchange. 1F1B (``v_stages=1``) waits either way.
    overlap_moe_expert_parallel_comm : bool
        Megatron-Core's combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``)
        [35]: the expert-parallel all-to-alls of a microbatch's forward run beside the
        backward of another, and the backward's beside the forward's, each hidden up to
        ``overlap_efficiency`` of the other phase's own work (its compute and TP and CP
        waits), in the steady state's pairs (without a pipeline ``m - 1`` of ``m``
        microbatches; interleaved, those past the first rank's warm-up). A paired step
        holds one layer's activations more than 1F1B at its peak (its forward builds one
        while its backward frees one). It needs
        ``ep_size > 1``, no full recompute, ``v_stages > 1`` where ``pp_size > 1`` and at
        most one MTP layer (else not ``realizable``). False (default).
    moe_shared_expert_overlap : bool
        Megatron-Core's ``--moe-shared-expert-overlap`` [49]: an MoE layer's shared
        experts run on a CUDA stream of their own, their first GEMM (with the activation)
        beside the dispatch (the all-to-all and the expert TP all-gather after it),
        their second beside the combine's all-to-all, and in
        the backward each GEMM's gradients beside that exchange's backward: each hides up
        to ``overlap_efficiency`` of the exchange it runs beside (``ep_communication_latency``
        is what is left). Their linear layers lose their TP mode: their pair (an
        all-gather of the 16-bit input, a reduce-scatter of the output) runs on their
        stream outside ``tp_comm_overlap``, priced exposed, and under SP the first GEMM
        keeps its gathered input whole on each TP rank (2 bytes a token of h, 1 under
        FP8's delayed scaling). The flex dispatcher's exchange is hidden alike (Megatron-Core
        lets the two meet since 2026; its earlier releases refused it, and Megatron-Bridge
        turns it off beside the flex dispatcher). Megatron-Core refuses it beside
        ``overlap_moe_expert_parallel_comm`` and, on a model with shared experts, beside
        "shared_experts" in ``recompute_modules`` under selective recompute (else not
        ``realizable``). A model without shared experts ignores it (Megatron-Core reads
        it only where they are set). Configurations that set it on a model with shared
        experts are priced on the numpy path, in a call of the fused kernel too. False
        (default).
    moe_enable_deepep : bool
        Megatron-Core's flex token dispatcher (``--moe-token-dispatcher-type flex``), with
        the backend ``moe_flex_dispatcher_backend`` names (DeepEP by default: Megatron-Core's
        ``--moe-enable-deepep``, now ``--moe-flex-dispatcher-backend deepep``) [39]: one
        exchange over the expert TP x EP group in
        which a token goes once to each rank holding one of its experts (over NVLink) and
        once to each other NVLink domain holding one (over the NICs), with routing taken
        as uniform; no TP gather after it. False (default): the all-to-all dispatcher,
        one copy per routed expert, then the expert TP all-gather [31]. An MoE model needs
        ``etp_size * ep_size > 1`` with it and, with DeepEP, an NVLink domain of at most 8
        GPUs (not a GB200/GB300 NVL72 rack, where NVIDIA runs HybridEP:
        ``moe_flex_dispatcher_backend``) (else not ``realizable``); a dense one ignores it.
    moe_flex_dispatcher_backend : {"deepep", "hybridep"}
        The flex dispatcher's backend (Megatron-Core's ``--moe-flex-dispatcher-backend``,
        which replaces ``--moe-enable-deepep``: "hybridep" is ``--moe-token-dispatcher-type
        flex --moe-flex-dispatcher-backend hybridep`` without ``--moe-enable-deepep``, beside
        which Megatron-Core raises "Only one backend is supported for flex token
        dispatcher"), read with ``moe_enable_deepep`` (here: the flex dispatcher) [50]:
        "deepep" (default), DeepEP's normal kernels, NVLink to 8 ranks and RDMA beyond;
        "hybridep", NVIDIA's HybridEP, the same exchange (a token once to each rank that
        holds one of its experts, once to each other domain that does, forwarded there)
        with NVLink across the whole domain, up to 72 ranks: on a GB200/GB300 NVL72 rack
        an EP group inside the rack sends nothing over the NICs. HybridEP runs on every
        domain size; it needs its group (``etp_size * ep_size`` ranks) split evenly over
        the domains it spans (inside one its groups tile, or whole ones: not EP 64 on
        racks filled to 72), at most 72 and an even number of its ranks a domain, and a
        hidden size divisible by 512 (its buffer's and kernels' checks; else not
        ``realizable``). Its own kernel efficiency is not modelled (the fitted link
        efficiencies apply). Configurations of an MoE model that set it beside the flex
        dispatcher are priced on the numpy path, in a call of the fused kernel too.
    moe_router_num_groups, moe_router_group_topk : int
        Group-limited routing (Megatron-Core's) [46]: the experts in
        ``moe_router_num_groups`` equal blocks, a token's top-k experts chosen from
        ``moe_router_group_topk`` of them. DeepSeek-V3's node-limited routing sets the
        groups to the EP group's nodes (8) and picks 4: a token reaches at most 4 nodes.
        It moves the flex dispatcher's traffic only (``moe_enable_deepep``: a token goes
        once to each rank and each domain that holds any of its experts, and concentrated
        experts fall on fewer of them), with the groups drawn uniformly and top-k /
        ``moe_router_group_topk`` experts in each, drawn uniformly there (the router ranks a
        group by the sum of that many of its best scores); the all-to-all dispatcher sends a
        copy per routed expert either way, as many crossing the fabric. Where an EP rank's
        (or a domain's) experts and a group neither fill the other evenly, or a chosen group
        gives one expert (top-k = ``moe_router_group_topk``: near the plain top-k, a group
        scored by its best alone), priced as uniform routing. ``moe_router_group_topk`` needs
        ``moe_router_num_groups`` set, dividing the experts and no smaller than it
        (Megatron-Core's checks), dividing top-k (Transformer Engine's fused router's) and
        groups of top-k / ``moe_router_group_topk`` experts or more (the router takes that
        many of each) (else not ``realizable``). 0 (default): not set; the groups are read
        only with ``moe_router_group_topk``. Configurations of the flex dispatcher
        that set it are priced on the numpy path, in a call of the fused kernel too.
    cpu_offloading_num_layers : int [1]
        Activation offloading to host memory (Megatron-Core's ``--cpu-offloading`` with
        ``--cpu-offloading-num-layers``, as Megatron-Bridge's ``cpu_offloading_num_layers``
        override sets them; NVIDIA's Llama 3 70B recipes on GB200 and GB300 offload 20 to 40
        layers beside Megatron-FSDP) [51]: the first that many layers' stored activations
        go to the host as the forward leaves each and come back before their backward, so
        the rank holds the other layers' (``memory_activations``). The copies cross the
        accelerator's host link (the catalog's ``host_link_bandwidth``, one way: PCIe Gen5
        x16 on HGX H100 and B200, NVLink-C2C on GB200 and GB300) on streams of their own;
        what a phase's copies outlast of the layers' work in that phase stalls it
        (``offload_latency``). Host memory is not counted. It needs one pipeline stage, no
        recompute, fewer layers than the model's and a catalog host link (else not
        ``realizable``). 0 (default): none. Configurations that set it are priced on the
        numpy path, in a call of the fused kernel too.
    hidden_dropout, attention_dropout : float [1]
        Dropout probabilities, Megatron-Core's (``--hidden-dropout``,
        ``--attention-dropout``; 0.1 each by default, as Megatron-Core's). They change
        memory only: a dropout keeps a one-byte mask for the backward where ``p > 0``
        (:func:`solver.megatron_memory.layer_activation_bytes`), so 0, as recent recipes
        set (Megatron-LM's Mixtral example passes ``--attention-dropout 0.0
        --hidden-dropout 0.0``), stores two masks of ``s b h`` a layer fewer and, in an
        unfused attention, 3 of its 5 bytes a score (with PyTorch 2.2 or later, whose
        ``torch.compile`` fuses Megatron-Core's bias-dropout-add; before, TorchScript kept
        the masks at 0 too). The step's time does not move: the dropout kernels' HBM
        traffic stays counted at 0 (in ``elementwise_bytes`` and, unfused, the scores').
        The input embedding's dropout on the first rank keeps its mask (a byte an element
        of its output, its SP slice) for each microbatch in flight where
        ``hidden_dropout > 0``.
    mtp_num_layers : int [1]
        Multi-token prediction modules (Megatron-Core's ``--mtp-num-layers``; DeepSeek-V3
        trains with 1), 0 to 63 [34]: each adds, on the last stage, a transformer layer
        (priced as the heaviest stage's layers), a projection of 2h -> h with its norms and
        the output head again, per microbatch, and its weights, gradients, optimizer state,
        one microbatch's activations and (pipelined) an embedding copy; Megatron-LM's MFU
        counts its FLOPs [34]. Its time and its memory are the last stage's (fewer layers
        there, ``num_layers_in_last_pipeline_stage``, rebalance them). Default 0: none.
    num_layers_in_first_pipeline_stage, num_layers_in_last_pipeline_stage : int [1]
        Layers of the first and of the last pipeline stage, Megatron-Core's
        ``TransformerConfig`` fields (``--decoder-first/last-pipeline-num-layers``) [13]: 0
        (Megatron's None) leaves a stage its even share. Set, the other layers split over
        the stages between, which must be whole (and, interleaved, every stage's layers a
        multiple of ``v_stages``) for ``realizable``; Llama 3 405B's 126 layers on 16
        stages run 7, 8 x 14, 7 [14]. The step is paced by the slowest of the first, a
        middle and the last stage (the LM head and MTP modules on it); memory is each
        rank's own (a lighter first stage moves the peak to rank 1); DP traffic is priced
        on the stage of the most layers (an upper bound), hidden behind its compute and its
        wait each microbatch for a slower paced stage. 0 to 4095.
    account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split : bool
        Megatron-Core's flags of the same names [36]: the input embedding (the loss) counts
        as a layer of the pipeline split, so the first (last) stage holds one transformer
        layer fewer. With a pipeline and neither stage's layers set, the layers plus one for
        each must split into ``pp_size`` equal stages (each a multiple of ``v_stages``) for
        ``realizable``, and the step is priced as those set stages are (Llama 3.1 405B's
        126 layers on 8 stages: 15, 16 x 6, 15, interleaved 8 ways). A stage left with no
        transformer layer (one layer a stage) is not priced as one here: not realizable.
        With a stage's layers set as well, not realizable (Megatron-Core refuses the two
        together); without a pipeline, no effect. Default False.
    engine : {"auto", "numpy", "fused"}
        ``"numpy"``: the broadcast numpy path (any shapes). ``"fused"``: the
        numba kernel of :mod:`solver.fused.megatron_kernel` (bitwise the same
        outputs), for flat inputs only: every knob a scalar or a 1-D array of
        one length, the constants scalars; else ``ValueError`` saying why.
        ``"auto"`` (default): fused where it can run (numba importable, flat
        inputs) and the call prices at least :data:`FUSED_MIN_POINTS`
        configurations, else numpy.
    check_shape : bool
        Warn (:class:`ShapeWarning`) where the workload's shape is not the model it declares
        (:func:`check_shape`). True by default; a sweep checks each workload once and
        passes False for its blocks.
    **constants : float or array_like
        Overrides of :data:`CONSTANTS` (names in :data:`CONSTANT_BOUNDS`).

    Returns
    -------
    dict of str -> numpy.ndarray
        :data:`OUTPUTS` in SI units, of the broadcast shape (read-only views
        where a term spans fewer axes). Where ``valid`` is False every float
        output is NaN and every bool False.

    Raises
    ------
    ValueError
        For a knob value no configuration can have, naming the knob and value; for a
        workload that is no transformer (kind other than ``"transformer"`` or ``"moe"``).
    """
    _check_inputs(workload, fleet, engine)
    # The knobs as given, by their names (tests/test_knobs.py holds the signature to KNOBS);
    # dp_size and etp_size only where set (None: from the fleet, from tp_size).
    given = locals()
    values = {name: given[name] for name in KNOBS
              if not (name in ("dp_size", "etp_size") and given[name] is None)}
    unchecked = []  # range checks left to the fused kernel, or made before the numpy path
    w = _Shape(workload)
    if check_shape:
        _check_shape(workload, w)
    k = _account_stages(w, _normalize(values, fast=engine != "numpy", unchecked=unchecked))
    return _price(w, fleet, k, constants, engine, {"unchecked": unchecked})


def prepare(workload: Workload, fleet: Fleet, *, engine="auto", check_shape=True, **knobs):
    """:func:`solve` with its layouts fixed, to price them under many sets of constants.

    ``prepare(workload, fleet, **knobs)(**constants)`` returns what
    ``solve(workload, fleet, **knobs, **constants)`` does, bit for bit. The knobs are
    checked and converted once, here, so a calibration fit or a Monte-Carlo study over
    uncertain constants pays on each call only for the physics.

    Parameters
    ----------
    workload, fleet, engine, check_shape
        As for :func:`solve`.
    **knobs
        :func:`solve`'s knobs (names in :data:`KNOBS`; the same defaults).

    Returns
    -------
    callable
        ``price(**constants) -> dict of str -> numpy.ndarray``: overrides of
        :data:`CONSTANTS` as for :func:`solve`.

    Raises
    ------
    TypeError
        For a name that is not a knob (constants go to the returned callable).
    ValueError
        For a knob value no configuration can have, as :func:`solve` does.
    """
    _check_inputs(workload, fleet, engine)
    values = _knob_values(knobs, "prepare", "; the constants go to the callable it returns")
    # copies: an array the caller changes later must not reach the physics unchecked
    w = _Shape(workload)
    if check_shape:
        _check_shape(workload, w)
    k = _account_stages(w, {name: np.array(v) for name, v in
                            _normalize(values, fast=engine != "numpy").items()})
    memo = {}  # what the fused path derives from the knobs, workload and fleet: once

    def price(**constants):
        return _price(w, fleet, k, constants, engine, memo)
    return price


def why_unrealizable(workload: Workload, fleet: Fleet, *, check_shape=True, **knobs) -> dict:
    """Why :func:`solve` marks layouts not ``realizable``: each rule they break, and where.

    Parameters
    ----------
    workload, fleet, check_shape, **knobs
        As for :func:`solve` (the same defaults; constants play no part); the workload and
        the fleet may be catalog keys, as :func:`solver.solve` takes them.

    Returns
    -------
    dict of str -> numpy.ndarray of bool
        Rule name -> True where a layout breaks it, for the rules some layout breaks:
        ``"valid"`` (the split cannot be made: TP x PP x CP does not divide the fleet, or
        the expert grid does not tile the ranks) and the conditions of
        :data:`megatron_steps.REALIZABLE_CONDITIONS`, which says what each asks. Empty
        where every layout is realizable.

    Examples
    --------
    >>> from solver import catalog
    >>> why = why_unrealizable(catalog.workload("DeepSeek_V3_MC"), catalog.fleet("HGX_H100_1K_MC"),
    ...                        batch_size=1024, tp_size=1, pp_size=16, ep_size=8)
    >>> sorted(why)  # 61 layers on 16 stages, no stage set
    ['layers']
    >>> steps.REALIZABLE_CONDITIONS["layers"][:43]
    'the layers split into pp_size * v_stages eq'
    """
    from .. import catalog  # (solver.catalog imports this module's constants: not at the top)
    workload = catalog.workload(workload) if isinstance(workload, str) else workload
    fleet = catalog.fleet(fleet) if isinstance(fleet, str) else fleet
    _check_inputs(workload, fleet, "numpy")
    w = _Shape(workload)
    if check_shape:
        _check_shape(workload, w)
    k = _account_stages(w, _normalize(_knob_values(knobs, "why_unrealizable")))
    split = steps.split(w, fleet, k)
    shape = np.broadcast_shapes(*(np.shape(v) for v in k.values()))
    broken = {"valid": ~np.asarray(split.valid)}
    broken.update({name: ~np.asarray(holds) for name, holds in
                   steps.realizable_conditions(w, fleet, k, split.m_exact, split.n_acc).items()})
    return {name: np.broadcast_to(where, shape).copy() for name, where in broken.items()
            if np.any(where)}


def _knob_values(knobs, caller, hint=""):
    """``knobs`` over :data:`DEFAULTS` (``dp_size`` and ``etp_size`` only where given: the
    fleet sizes dp, etp is tp); TypeError naming ``caller`` for a name that is no knob."""
    unknown = [name for name in knobs if name not in KNOBS]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r} (knobs: "
                        f"{', '.join(KNOBS)}{hint})")
    values = {name: knobs.get(name, default) for name, default in DEFAULTS.items()
              if default is not None}
    for name in ("dp_size", "etp_size"):
        if knobs.get(name) is not None:
            values[name] = knobs[name]
    return values


def _check_kind(workload: Workload) -> None:
    """ValueError unless ``workload`` is a transformer (kind ``"transformer"`` or ``"moe"``):
    the megatron physics prices Megatron-Core's transformer layers only, and would price a
    CNN, an SSM or a model of no stated kind as one."""
    if not workload.is_transformer:
        raise ValueError(
            f"workload {workload.name!r} is of kind {workload.kind!r}, but the megatron physics "
            f"prices transformers only (kind 'transformer' or 'moe'): price it with "
            f"physics='mlsysim'")


def _check_inputs(workload, fleet, engine):
    """TypeError / ValueError for what solve and prepare cannot take besides the knobs."""
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a solver.specs.Workload, but got {type(workload).__name__}")
    if not isinstance(fleet, Fleet):
        raise TypeError(f"fleet must be a solver.specs.Fleet, but got {type(fleet).__name__}")
    _check_kind(workload)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}, but got {engine!r}")


def _price(w, fleet, k, constants, engine, memo):
    """solve's outputs for normalized knobs ``k`` and constant overrides (``memo``: a dict
    the fused path keeps its per-(knobs, workload, fleet) inputs in between calls; its
    ``"unchecked"``: knobs of ``k`` whose range checks are still to be made)."""
    c = _constants(constants)
    try:
        if "knob_shape" not in memo:
            memo["knob_shape"] = np.broadcast_shapes(*(np.shape(v) for v in k.values()))
        shape = np.broadcast_shapes(memo["knob_shape"], *(np.shape(v) for v in c.values()))
    except ValueError:
        shapes = {n: np.shape(v) for n, v in {**k, **c}.items() if np.shape(v)}
        raise ValueError("the array knobs must broadcast together, but got "
                         + ", ".join(f"{n} of shape {s}" for n, s in shapes.items())) from None
    if engine != "numpy":
        why = _array_constant(c)
        if why is not None and engine == "fused":
            raise ValueError(f"engine='fused' cannot price this call: {why} (engine='numpy' or "
                             f"'auto' can)")
        # the one rule of solver.fused on the knobs' broadcast shape
        if why is None and fused.resolve_engine(engine, {"the broadcast of the knobs": shape}) == "fused":
            rows = _beside_rows(w, k, shape, fleet)
            if rows is None or not rows[1].all():
                return _beside_kernel(w, fleet, k, c, shape,
                                      _solve_fused(w, fleet, k, c, shape, memo), rows)
            # (every configuration is priced beside the kernel: the numpy path alone)
    _check_deferred(k, memo)
    return _solve(w, fleet, k, c, shape)


def _check_deferred(k, memo):
    """The checks :func:`_normalize` left to the fused kernel: made (ValueError naming the
    knob and the value), names turned into codes in ``k``, and struck off. Only the fused
    path defers any (it needs numba, which an install without the ``fast`` extra lacks)."""
    if not memo.get("unchecked"):
        return
    from ..fused import megatron_kernel as fk
    for name in memo["unchecked"]:
        if KNOBS[name].kind == "choice":
            k[name] = _choice_codes(name, k[name], fk)
        else:
            knobs_._CONVERT["int"](KNOBS[name], k[name])
    memo["unchecked"] = []


#: The least and the largest value of each integer knob the fused kernel reads, in the
#: order of its arrays (batch_size ... zero_stage), within +-(2**53 - 1) (solver.knobs).
_KERNEL_INTS = ("batch_size", "seq_len", "tp_size", "pp_size", "cp_size", "ep_size", "dp_size",
                "v_stages", "micro_batch_size", "zero_stage", "etp_size")
_KERNEL_BOUNDS = tuple(
    int(bound) for name in _KERNEL_INTS
    for bound in (max(KNOBS[name].low if KNOBS[name].low is not None else -knobs_.MAX_INTEGER,
                      1 - knobs_.MAX_INTEGER),
                  min(KNOBS[name].high if KNOBS[name].high is not None else knobs_.MAX_INTEGER,
                      knobs_.MAX_INTEGER - 1)))


# ------------------------------------------------------------------ engines

# ENGINES and FUSED_MIN_POINTS: the one rule of solver.fused, shared with mlsysim.


def _beside_defaults():
    """Each knob of :data:`_BESIDE_KERNEL` at its default, as :func:`_normalize` codes it."""
    return {name: (CHOICES[name].index(DEFAULTS[name]) if name in CHOICES else DEFAULTS[name])
            for name in _BESIDE_KERNEL}


def _sets_any(k, defaults):
    """Whether any knob of ``defaults`` differs from its default in ``k``: the cheap test a
    small call (a calibration fit's) makes before :func:`_beside_rows` reads them one by one."""
    for name, default in defaults.items():
        value = k.get(name)
        if value is None:
            continue
        if getattr(value, "ndim", 0):
            if (value != default).any():
                return True
        elif value != default:
            return True
    return False


def _beside_rows(w, k, shape, fleet=None):
    """Which configurations set a knob the fused kernel does not read (:data:`_BESIDE_KERNEL`)
    where it matters, flat: ``(rule, priced)``, the rows where a knob only breaks its rule
    (``realizable`` False, the rest the kernel's) and the rows :func:`_solve` prices again;
    None where none sets one. A partial recompute (``recompute_num_layers`` under
    ``recompute="full"``), a context-parallel exchange other than the ring (``cp_comm_type``
    at ``cp_size > 1``), ``fp8_param_gather`` where its gathers run in FP8
    (``precision="fp8"``, ``zero_stage >= 1``), Transformer Engine's fused cross-entropy,
    the precision-aware optimizer where it runs (``zero_stage >= 1``), selective recompute
    of other modules than the attention core alone (``recompute_modules``) and (of an MoE
    model) the flex dispatcher under group-limited routing (``moe_router_group_topk``) are
    priced again; ``recompute_num_layers`` outside full recompute, ``fp8_param_gather`` elsewhere,
    ``use_precision_aware_optimizer`` at ``zero_stage=0``, the optimizer's dtypes other than
    FP32 without it, and group-limited routing that breaks its rule beside the all-to-all
    dispatcher only break their rules;
    ``cp_comm_type`` at ``cp_size=1``, ``cp_a2a_size`` outside ``"a2a+p2p"``,
    ``cross_entropy_fusion_impl`` without the fusion, ``store_param_remainders`` without the
    precision-aware optimizer, and
    ``moe_router_num_groups`` without ``moe_router_group_topk`` (or on a dense model),
    ``recompute_modules`` outside selective recompute (but for "moe" beside the combined 1F1B
    schedule, which only breaks its rule), ``moe_shared_expert_overlap`` on a model without
    shared experts (but beside that schedule, which only breaks its rule; with them it is
    priced again), ``moe_flex_dispatcher_backend`` outside the flex dispatcher (of an MoE
    model; "hybridep" beside it is priced again), the flex dispatcher on an accelerator of
    another architecture than :data:`~.megatron_steps.FLEX_ARCHITECTURES` (which only breaks
    its rule; ``fleet`` tells) and ``fp8_recipe`` outside FP8 change nothing;
    ``cpu_offloading_num_layers`` is priced again wherever set (the kernel's
    ``offload_latency`` is 0.0); under FP8, ``fp8_recipe`` "tensorwise" changes what the precision-aware
    optimizer does (priced with it) and the blockwise recipes, whose rule is the fleet's,
    are priced again."""
    foreign_arch = bool(w.moe and fleet is not None and not steps.flex_runs_on(fleet))
    if not foreign_arch and not _sets_any(k, _BESIDE_DEFAULTS):
        return None
    rnl = np.asarray(k.get("recompute_num_layers", 0))
    cpc = np.asarray(k.get("cp_comm_type", 0))
    fp8_params = np.asarray(k.get("fp8_param_gather", False))
    ce_te = steps.te_cross_entropy(k)
    pa = np.asarray(k.get("use_precision_aware_optimizer", False))
    modules = np.asarray(k.get("recompute_modules", 0)) != 0
    dtypes = ((np.asarray(k.get("main_params_dtype", 0)) != 0)
              | (np.asarray(k.get("exp_avg_dtype", 0)) != 0)
              | (np.asarray(k.get("exp_avg_sq_dtype", 0)) != 0))
    grouped = np.asarray(k.get("moe_router_group_topk", 0)) > 0
    if not w.moe:
        grouped = np.zeros((), dtype=bool)  # (a dense model has no router: nothing to price)
    recipe = np.asarray(k.get("fp8_recipe", 0)) != 0
    uniform = steps._uniform(k)
    se_overlap = np.asarray(k.get("moe_shared_expert_overlap", False))
    hybrid = steps.hybridep(k) if w.moe else np.zeros((), dtype=bool)
    # (the flex dispatcher on an accelerator its backends do not run on only breaks its rule)
    foreign = np.zeros((), dtype=bool)
    if foreign_arch:
        foreign = np.asarray(k["moe_enable_deepep"])
    if not (np.any(rnl != 0) or np.any(cpc != 0) or np.any(fp8_params) or np.any(ce_te)
            or np.any(pa) or np.any(dtypes) or np.any(grouped) or np.any(modules)
            or np.any(recipe) or np.any(uniform) or np.any(se_overlap) or np.any(hybrid)
            or np.any(foreign) or np.any(np.asarray(k.get("cpu_offloading_num_layers", 0)) > 0)):
        return None
    n = int(np.prod(shape)) if shape else 1

    def flat(value):
        return np.broadcast_to(value, (n,))

    def codes(name):  # (names the kernel matched: _normalize's unchecked)
        value = k[name]
        return flat(np.asarray(_codes(name, value) if np.asarray(value).dtype.kind in "UO"
                               else value))
    full = codes("recompute") == RECOMPUTE.index("full")
    moe_overlap = np.zeros(n, dtype=bool)
    if np.any(modules):  # (read under selective recompute only)
        selective = codes("recompute") == RECOMPUTE.index("selective")
        # ("moe" beside the combined 1F1B schedule breaks its rule under any recompute)
        moe_overlap = ~selective & flat(steps.names_module(
            {"recompute_modules": codes("recompute_modules")}, "moe")) & flat(
            np.asarray(k["overlap_moe_expert_parallel_comm"]))
        modules = flat(modules) & selective
    rnl, fp8_params = flat(rnl != 0), flat(fp8_params)
    gathers_fp8 = np.zeros(n, dtype=bool)
    if np.any(fp8_params):
        gathers_fp8 = ((codes("precision") == PRECISIONS.index("fp8"))
                       & (flat(np.asarray(k["zero_stage"])) >= 1))
    pa, pa_on = flat(pa), flat(steps.precision_aware(k))
    grouped = flat(grouped)
    flex = grouped & flat(np.asarray(k["moe_enable_deepep"]))
    broken = grouped & ~flex & ~flat(steps._groups_hold(
        w, np.asarray(k.get("moe_router_num_groups", 0)), np.asarray(k["moe_router_group_topk"]))) \
        if np.any(grouped) else grouped
    priced = ((rnl & full) | (flat(cpc != 0) & flat(np.asarray(k["cp_size"]) > 1))
              | (fp8_params & gathers_fp8) | flat(ce_te) | pa_on | flex | flat(modules)
              | flat(hybrid) | flat(np.asarray(k.get("cpu_offloading_num_layers", 0)) > 0))
    if np.any(recipe):
        # (a recipe of blocks under FP8: its rule is the fleet's, which the numpy path reads)
        recipe = flat(recipe) & (codes("precision") == PRECISIONS.index("fp8")) & (
            codes("fp8_recipe") != steps.FP8_RECIPES.index("tensorwise"))
        priced = priced | recipe
    if np.any(uniform):
        # (the uniform method under selective recompute or beside the combined 1F1B schedule
        # only breaks its rule; under full recompute, its rows with recompute_num_layers set
        # are priced again above)
        uniform = flat(uniform) & ~full & (
            (codes("recompute") == RECOMPUTE.index("selective"))
            | flat(np.asarray(k["overlap_moe_expert_parallel_comm"])))
    else:
        uniform = np.zeros(n, dtype=bool)
    if np.any(se_overlap):
        # (the shared experts beside the dispatcher, where the model has them; on one that
        # has none it only breaks its rule beside the combined 1F1B schedule)
        se_overlap = flat(se_overlap)
        if w.moe and w.shared:
            priced = priced | se_overlap
            se_overlap = np.zeros(n, dtype=bool)
        else:
            se_overlap = se_overlap & flat(np.asarray(k["overlap_moe_expert_parallel_comm"]))
    else:
        se_overlap = np.zeros(n, dtype=bool)
    return ((rnl & ~full) | (fp8_params & ~gathers_fp8) | (pa & ~pa_on) | (flat(dtypes) & ~pa)
            | broken | moe_overlap | uniform | se_overlap | flat(foreign)), priced


_BESIDE_DEFAULTS = _beside_defaults()


def _beside_kernel(w: _Shape, fleet: Fleet, k, c, shape, out, rows):
    """The fused kernel's outputs ``out`` with the configurations whose knobs it does not
    read made the numpy path's (``rows``: :func:`_beside_rows`): it prices every layer
    alike, the K/V ring only, 16-bit parameter gathers and the unfused cross-entropy, so
    those configurations are priced again by :func:`_solve` alone, and where a knob only
    breaks its rule ``realizable`` is made False. The same bits as the numpy path
    throughout; a call that sets none passes through."""
    if rows is None:
        return out
    n = int(np.prod(shape)) if shape else 1
    rule, priced = rows
    flat = {name: np.asarray(value).reshape(n) for name, value in out.items()}
    flat["realizable"][rule] = False
    idx = np.flatnonzero(priced)
    if idx.size and not flat["offload_latency"].flags.writeable:
        # (the kernel's zeros are one read-only view)
        flat["offload_latency"] = np.zeros(n)
        out["offload_latency"] = flat["offload_latency"].reshape(shape)
    if idx.size:
        sub = {}
        for name, value in k.items():
            value = np.asarray(value)
            if name in _CHOICES and value.dtype.kind in "UO":
                value = _codes(name, value)
            sub[name] = value[idx] if value.ndim == 1 and value.shape[0] == n else value
        priced_out = _solve(w, fleet, sub, c, (idx.size,))
        for name in OUTPUTS:
            flat[name][idx] = priced_out[name]
    return out


def _array_constant(c):
    """Why the fused kernel cannot take these constants (None: every one a scalar)."""
    for name, value in c.items():
        if np.ndim(value):
            return f"constants must be scalars there, but {name} is an array of shape {np.shape(value)}"
    return None


_FUSED_DTYPES = {"int": np.int64, "bool": np.bool_, "choice": np.int64}
#: Knobs the fused kernel receives packed into one byte (megatron_kernel.memory_flags): what a
#: layout's memory reads beside its knobs, and the combined 1F1B schedule's flag.
_MEMORY_KNOBS = ("grad_reduce_in_bf16", "hidden_dropout", "attention_dropout",
                 "overlap_moe_expert_parallel_comm", "pipeline_split", "fsdp_own_nic",
                 "moe_enable_deepep")


def _flat(name, value, n):
    """A knob as a contiguous 1-D array of length ``n`` of the kernel's dtype (int64 or bool).

    A scalar is spread into an array of :func:`solver.fused.buffers.empty` (one an
    earlier call dropped, its pages already faulted in): a fresh ``np.full`` of a
    million int64 costs the page faults of 8 MB on every call."""
    array = np.asarray(value)
    if array.dtype.kind == "U":  # names the kernel matches (see _normalize)
        from ..fused import megatron_kernel as fk
        return fk.name_characters(array)
    return _spread(array, n, _FUSED_DTYPES[KNOBS[name].kind])


def _spread(array, n, dtype):
    """``array`` (a scalar or ``n`` values) as a contiguous 1-D array of ``n`` ``dtype``."""
    if array.ndim == 1 and array.shape[0] == n:
        return np.ascontiguousarray(array, dtype=dtype)
    out = buffers.empty(n, dtype)
    out.fill(array.reshape(()) if array.ndim else array)
    return out


#: Knobs the fused kernel receives packed into one word (megatron_kernel.pipeline_flags).
_PIPELINE_KNOBS = ("scatter_gather_tensors_in_pipeline", "overlap_p2p_comm", "mtp_num_layers",
                   "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")


def _fused_arrays(k, n):
    """The normalized knobs ``k`` as the fused kernel's inputs, each ``n`` long: one array
    a knob, but the pipeline's (``p2p_flags``) and the memory's (``memory_flags``) packed."""
    from ..fused import megatron_kernel as fk
    # (recompute_num_layers, cp_comm_type: not read by the kernel, see _beside_kernel)
    packed = _PIPELINE_KNOBS + _MEMORY_KNOBS + _BESIDE_KERNEL
    a = {name: _flat(name, k[name], n) for name in KNOBS if name in k and name not in packed}
    a["p2p_flags"] = _spread(fk.pipeline_flags(*(k[name] for name in _PIPELINE_KNOBS)), n,
                             np.uint32)
    a["memory_flags"] = _spread(fk.memory_flags(*(k.get(name, 0) for name in _MEMORY_KNOBS)),
                                n, np.uint8)
    return a


def _solve_fused(w: _Shape, fleet: Fleet, k, c, shape, memo):
    """:func:`_solve` for flat inputs (``shape`` is ``(n,)`` or ``()``), in one pass
    (:mod:`solver.fused.megatron_kernel`). ``memo``: a dict that keeps the kernel's
    inputs from the knobs, workload and fleet between calls on the same ones (prepare)."""
    from ..fused import megatron_kernel as fk
    n = shape[0] if shape else 1
    if memo.get("n") != n:
        memo.update(n=n, a=_fused_arrays(k, n), w=fk.workload_scalars(w), f=fk.fleet_scalars(fleet))
    a = memo["a"]
    # the memo holds the catalog's plateaus; a set gemm_plateau replaces them (steps._plateau)
    f = fk.fleet_scalars(fleet, constants=c) if c["gemm_plateau"] > 0.0 else memo["f"]
    has_dp = "dp_size" in a
    fo, bo, ok = fk.run(memo["w"], f, fk.constant_scalars(c, fleet.node.accelerator), n,
                        has_dp, a["batch_size"], a["seq_len"], a["tp_size"], a["pp_size"],
                        a["cp_size"], a["ep_size"], a.get("etp_size", a["tp_size"]),
                        a["dp_size"] if has_dp else a["tp_size"],
                        a["v_stages"], a["micro_batch_size"], a["sequence_parallel"],
                        a["recompute"], a["zero_stage"], a["precision"], a["tp_comm_overlap"],
                        a["overlap_grad_reduce"], a["overlap_param_gather"],
                        a["flash_attention"], a["memory_flags"],
                        a["p2p_flags"],
                        _KERNEL_BOUNDS,
                        (_CHOICES["recompute"], _CHOICES["precision"]))
    if not ok:
        names = [name for name in memo.get("unchecked", ()) if KNOBS[name].kind == "choice"]
        _check_deferred(k, memo)  # raises, naming the knob and the value
        if names:  # names the exact match refused but the checking converter takes ("BF16")
            memo.pop("n")
            return _solve_fused(w, fleet, k, c, shape, memo)
        raise AssertionError("the fused kernel refused an integer knob value the checks accept")
    memo["unchecked"] = []
    rows = {name: fo[j].reshape(shape) for j, name in enumerate(fk.FLOAT_OUTPUTS)}
    rows.update({name: bo[j].reshape(shape) for j, name in enumerate(fk.BOOL_OUTPUTS)})
    # (no offloading in the kernel: cpu_offloading_num_layers is priced beside it; NaN
    # where the split is not valid, as every float output)
    valid = rows["valid"]
    if valid.all():
        rows["offload_latency"] = np.broadcast_to(_ZERO, shape)
    else:
        none = buffers.empty(n, np.float64)
        none.fill(0.0)
        np.copyto(none, np.nan, where=~valid.reshape(n))
        rows["offload_latency"] = none.reshape(shape)
    return {name: rows[name] for name in OUTPUTS}


_ZERO = np.zeros((), dtype=np.float64)


def _solve(w: _Shape, fleet: Fleet, k, c, shape):
    """The steps in order (:mod:`.megatron_steps`, :mod:`.megatron_compose`), like ModelChain.run_model."""
    sp = steps.split(w, fleet, k)
    hw = steps.hardware(fleet, c, sp.prec, k["grad_reduce_in_bf16"])
    ly = steps.layer_times(w, k, c, sp, hw)
    cm = steps.communication(w, k, c, sp, hw, ly)
    plain = None
    if sp.partial:  # recompute_num_layers [40]: the layers it leaves alone, priced apart
        sp0 = sp.plain()
        ly0 = steps.layer_times(w, k, c, sp0, hw)
        plain = (ly0, steps.communication(w, k, c, sp0, hw, ly0))
    pl = steps.pipeline(w, c, sp, hw, ly, cm, plain)
    dpr = after.data_parallel(w, k, c, sp, hw, ly, cm, pl)
    mm = after.memory(w, k, sp, hw, ly, pl, dpr)
    return after.compose(w, c, sp, hw, ly, cm, pl, dpr, mm, shape, OUTPUTS)
