"""GPUModelRunner: one engine step = one packed forward over the paged KV pools (vLLM 0.34.0:
v1/worker/gpu/model_runner.py; 0.33.0 had v1/worker/gpu_model_runner.py, which 0.34.0 removed).

Read top to bottom, a step is what vLLM's ``GPUModelRunner.execute_model`` and then
``sample_tokens`` do:

1. :meth:`GPUModelRunner.prepare_inputs` lays the scheduled requests' tokens along one axis
   (an :class:`kvcore.worker.gpu.input_batch.InputBatch`): ``input_ids``, ``positions``,
   ``query_start_loc``, ``seq_lens``, ``logits_indices`` and, per KV cache group, the
   ``block_table`` and ``slot_mapping``;
2. :meth:`GPUModelRunner.prepare_attn` makes each group's block table and slot mapping tensors,
   and :func:`kvcore.worker.gpu.attn_utils.build_attn_metadata` each group's
   ``CommonAttentionMetadata`` from them and the batch's lengths;
3. the model runs once (batch dimension 1); every decoder layer writes its new K/V to the
   ``slot_mapping`` slots and reads through the block table
   (:mod:`kvcore.worker.paged_attention`);
4. logits are computed only at ``logits_indices``, and the next tokens sampled (vLLM samples
   with its ``Sampler``, v1/worker/gpu/sample/sampler.py; kvcore takes the argmax, or draws
   from a seeded generator, here, and has no sampler file).

``last_inputs`` keeps step 1's result, which the engine stores in the step's record.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from kvcore.config.lora import LoRAConfig
from kvcore.model.cpu_packing import pack_for_cpu
from kvcore.model.loader import LoadedModel
from kvcore.model.reference import shared_clone
from kvcore.worker.gpu.attn_utils import build_attn_metadata
from kvcore.worker.gpu.input_batch import InputBatch, SeqBatchItem, first_visible_block
from kvcore.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
from kvcore.worker.mamba_utils import MambaStatePools, PagedLinearAttention, state_step_metadata
from kvcore.worker.paged_attention import ATTN_NAME, PagedStep, build_paged_step, pool_views_of

__all__ = ["GPUModelRunner", "SeqBatchItem", "InputBatch"]


NULL_BLOCK = 0  # block 0: a table entry that is never read


def _check_table(
    item: SeqBatchItem,
    group: int,
    table: Sequence[int],
    first: int,
    last: int,
    num_blocks: int,
    window: int | None,
) -> None:
    rid = item.request_id
    if len(table) <= last:
        raise ValueError(
            f"request {rid!r}: block table of group {group} has {len(table)} entries "
            f"but the step needs logical block {last}"
        )
    used = list(table[first : last + 1])
    if NULL_BLOCK in used:
        where = first + used.index(NULL_BLOCK)
        what = "inside the sliding window" if window else "in a full-attention table"
        raise ValueError(
            f"request {rid!r}: logical block {where} of group {group} is the null block "
            f"{what}; only blocks wholly before position start-W+1 may be null"
        )
    bad = [b for b in used if b < 0 or b >= num_blocks]
    if bad:
        raise ValueError(
            f"request {rid!r}: block id {bad[0]} is outside the pool of {num_blocks} blocks"
        )


class GPUModelRunner(LoRAModelRunnerMixin):
    """Owns the paged KV pools (one tensor per decoder layer) and runs steps.

    layer_group[i]: the KV cache group decoder layer i reads/writes through.
    group_sliding_window[g]: None = full attention, W = sliding window of W tokens.
    seed: None = greedy (argmax, ties -> lowest id); an int = sampling at temperature 1
    from a torch.Generator seeded once here (same steps -> same tokens).

    The runner works on a shallow clone of ``loaded.model`` that shares every weight
    tensor but has its own config, switched to the paged attention; ``loaded.model``
    itself is left untouched (it keeps its sdpa attention and plain ``nn.Linear`` layers
    for ``generate``).  On the CPU the clone's linear layers are pre-packed
    (:func:`kvcore.model.cpu_packing.pack_for_cpu`).

    A hybrid model (``config.layer_types`` with ``linear_attention``, e.g. tiny-hybrid): the
    groups of its linear layers are state-block groups; each such layer of the clone is wrapped
    in :class:`kvcore.worker.mamba_utils.PagedLinearAttention` and keeps its states in
    ``state_pools`` (block ids shared with the attention layers' KV pools, as vLLM's one pool).

    ``lora_config``: serve LoRA adapters (vLLM's ``enable_lora``): the clone's target modules are
    wrapped (:mod:`kvcore.worker.lora_model_runner_mixin`) and each item's ``lora_request``
    applies to its own tokens only; None: no LoRA, and an item with a ``lora_request`` is refused.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        layer_group: Sequence[int] | None = None,
        group_sliding_window: Sequence[int | None] | None = None,
        seed: int | None = None,
        lora_config: LoRAConfig | None = None,
        table_of_group: Sequence[int] | None = None,
    ) -> None:
        cfg = loaded.config
        n_layers = int(cfg.num_hidden_layers)
        layer_group = [0] * n_layers if layer_group is None else [int(g) for g in layer_group]
        group_sliding_window = (
            [None]
            if group_sliding_window is None
            else [None if w is None else int(w) for w in group_sliding_window]
        )
        if len(layer_group) != n_layers:
            raise ValueError(
                f"layer_group has {len(layer_group)} entries; the model has {n_layers} layers"
            )
        if any(g < 0 or g >= len(group_sliding_window) for g in layer_group):
            raise ValueError(
                f"layer_group {layer_group} names a group beyond {len(group_sliding_window)} groups"
            )
        if any(w is not None and w < 1 for w in group_sliding_window):
            raise ValueError(f"sliding windows must be >= 1: {group_sliding_window}")
        if num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 (block 0 is the null block)")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")

        self.loaded = loaded
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.layer_group = layer_group
        self.group_sliding_window = group_sliding_window
        # worker group g reads the block table of KV cache group table_of_group[g]: with the
        # hybrid KV cache manager off, full-attention and sliding-window layers share one table
        # (one KV cache group) and each still attends as it is built to; None: group g's own
        self.table_of_group = None if table_of_group is None else [int(t) for t in table_of_group]
        if self.table_of_group is not None and len(self.table_of_group) != len(
            group_sliding_window
        ):
            raise ValueError("table_of_group needs one KV cache group per worker group")
        self.seed = seed
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.num_layers = n_layers
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.num_heads = int(cfg.num_attention_heads)
        self.head_dim = int(
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        )
        self.vocab_size = int(cfg.vocab_size)

        self.model = shared_clone(loaded.model)
        self.model.set_attn_implementation(ATTN_NAME)
        self.model.eval()
        self.num_packed_layers = pack_for_cpu(self.model)  # only in the runner's clone
        if lora_config is not None:  # wraps the (packed) target modules of the clone
            self.model = self.load_lora_model(self.model, lora_config, self.device, self.dtype)
        types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * n_layers)
        linear = [i for i, t in enumerate(types) if t == "linear_attention"]
        self.state_groups = frozenset(layer_group[i] for i in linear)
        if any(layer_group[i] in self.state_groups for i, t in enumerate(types) if i not in linear):
            raise ValueError(
                f"layer_group {layer_group} puts an attention layer in a linear layers' group"
            )
        self.state_pools = MambaStatePools.allocate(
            cfg, linear, self.num_blocks, self.dtype, self.device
        )
        for i in linear:
            layer = self.model.model.layers[i]
            layer.linear_attn = PagedLinearAttention(layer.linear_attn, self.state_pools)

        # vLLM's layout: [num_blocks, 2 (K, V), num_kv_heads, block_size, head_dim] per layer
        shape = (self.num_blocks, 2, self.num_kv_heads, self.block_size, self.head_dim)
        with torch.inference_mode():
            self.kv_caches: list[torch.Tensor] = [
                torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(n_layers)
            ]
        self._pool_views = pool_views_of(self.kv_caches)
        self._generator: torch.Generator | None = None
        if seed is not None:
            self._generator = torch.Generator(device=self.device)
            self._generator.manual_seed(int(seed))
        # vLLM's per-request SamplingParams.seed: request id -> its own generator
        self.request_generators: dict[str, torch.Generator] = {}
        self.last_inputs: InputBatch | None = None  # the last step's inputs (for the step record)
        self.last_step: PagedStep | None = None  # what the last step's kernel indexed (tests)
        # An EAGLE drafter's input (keep_hidden_states): per sampling request, the hidden states
        # the LM head read in the last verify step, one row per logits position.
        self.last_hidden_states: dict[str, torch.Tensor] = {}
        self._lm_head_input: torch.Tensor | None = None
        self._hidden_hook = None

    def add_request_seed(self, request_id: str, seed: int) -> None:
        """Sample ``request_id`` at temperature 1 from a generator of its own, seeded once here."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        self.request_generators[request_id] = gen

    @property
    def kv_cache_shape(self) -> tuple[int, ...]:
        return tuple(self.kv_caches[0].shape)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches)

    @torch.inference_mode()
    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Perform ``SchedulerOutput.kv_cache_block_copies`` before the step's forward: each
        (src, dst) copies block src into block dst in every layer's pool (the copy-on-write of
        a block hit only in part, the copies vLLM 0.34's scheduler sends the worker)."""
        for t in self.kv_caches:
            for src, dst in copies:
                t[dst].copy_(t[src])
        self.state_pools.copy_blocks(copies)

    def worker_items(self, items: Sequence[SeqBatchItem]) -> Sequence[SeqBatchItem]:
        """The items with one block table per worker group (``table_of_group``)."""
        if self.table_of_group is None:
            return items
        return [
            replace(it, block_tables=tuple(it.block_tables[t] for t in self.table_of_group))
            for it in items
        ]

    def prepare_inputs(self, items: Sequence[SeqBatchItem]) -> InputBatch:
        """The step's :class:`InputBatch` from the scheduled items, in their order (vLLM
        0.34.0's ``GPUModelRunner.prepare_inputs``); ValueError naming the request if a table
        cannot serve it.

        vLLM's method reads the ``SchedulerOutput`` and the request states the runner keeps across
        steps (``batch_req_state``), and pads the batch for a CUDA graph (``batch_desc``); kvcore's
        engine hands the runner one :class:`SeqBatchItem` per scheduled request instead, and
        nothing is padded. The items go through :meth:`worker_items` first (one block table per
        worker group). A table is checked only for the blocks the step may read; the tables of
        ``state_groups`` (the Mamba state-block groups, null between the states align mode keeps)
        are not: :func:`kvcore.worker.mamba_utils.state_step_metadata` checks the two blocks a step
        uses there."""
        items = self.worker_items(items)
        block_size = self.block_size
        group_sliding_window = self.group_sliding_window
        num_blocks = self.num_blocks
        state_groups = self.state_groups
        if len({it.request_id for it in items}) != len(items):
            raise ValueError("a request appears twice in one step")
        input_ids: list[int] = []
        positions: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        logits_indices: list[int] = []
        sample_req_ids: list[str] = []
        tables: list[list[tuple[int, ...]]] = [[] for _ in group_sliding_window]
        slots: list[list[int]] = [[] for _ in group_sliding_window]
        for it in items:
            n = len(it.token_ids)
            if n == 0:
                raise ValueError(f"request {it.request_id!r}: no tokens to feed")
            if it.start_pos < 0:
                raise ValueError(f"request {it.request_id!r}: negative start_pos")
            if len(it.block_tables) != len(group_sliding_window):
                raise ValueError(
                    f"request {it.request_id!r}: {len(it.block_tables)} block tables for "
                    f"{len(group_sliding_window)} KV cache groups"
                )
            pos = range(it.start_pos, it.start_pos + n)
            last = (pos[-1]) // block_size
            for g, window in enumerate(group_sliding_window):
                table = it.block_tables[g]
                if g not in state_groups:
                    _check_table(
                        it,
                        g,
                        table,
                        first_visible_block(it.start_pos, block_size, window),
                        last,
                        num_blocks,
                        window,
                    )
                tables[g].append(tuple(int(b) for b in table))
                slots[g].extend(table[p // block_size] * block_size + p % block_size for p in pos)
            if it.embeds is not None and len(it.embeds) != n:
                raise ValueError(
                    f"request {it.request_id!r}: {len(it.embeds)} embedding entries for {n} tokens"
                )
            input_ids.extend(int(t) for t in it.token_ids)
            positions.extend(pos)
            query_start_loc.append(query_start_loc[-1] + n)
            seq_lens.append(it.start_pos + n)
            if it.sample:
                if not 0 <= it.num_draft_tokens < n:
                    raise ValueError(
                        f"request {it.request_id!r}: {it.num_draft_tokens} drafts among {n} tokens"
                    )
                end = query_start_loc[-1]
                logits_indices.extend(range(end - 1 - it.num_draft_tokens, end))
                sample_req_ids.extend([it.request_id] * (it.num_draft_tokens + 1))
        return InputBatch(
            block_size=int(block_size),
            req_ids=tuple(it.request_id for it in items),
            input_ids=tuple(input_ids),
            positions=tuple(positions),
            query_start_loc=tuple(query_start_loc),
            seq_lens=tuple(seq_lens),
            logits_indices=tuple(logits_indices),
            sample_req_ids=tuple(sample_req_ids),
            block_table=tuple(tuple(g) for g in tables),
            slot_mapping=tuple(tuple(g) for g in slots),
        )

    def prepare_attn(
        self, input_batch: InputBatch
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Each KV cache group's block table, ``[num_reqs, max_num_blocks]`` padded with the
        null block 0 (never read), and the slot mappings, ``[num_kv_cache_groups, num_tokens]``
        (vLLM 0.34.0's ``GPUModelRunner.prepare_attn``, which gathers them from the tables it
        keeps on the GPU; kvcore's are in the batch already). Host tensors."""
        block_tables = []
        for tables in input_batch.block_table:
            width = max(len(t) for t in tables)
            block_table = torch.zeros((input_batch.num_reqs, width), dtype=torch.long)
            for i, t in enumerate(tables):
                block_table[i, : len(t)] = torch.tensor(t, dtype=torch.long)
            block_tables.append(block_table)
        slot_mappings = torch.tensor(input_batch.slot_mapping, dtype=torch.long)
        return tuple(block_tables), slot_mappings

    def read_block(self, layer: int, block_id: int) -> torch.Tensor:
        """A copy of one block of one layer: [2 (K,V), num_kv_heads, block_size, head_dim]."""
        return self.kv_caches[layer][block_id].detach().clone()

    def _forward(
        self, items: Sequence[SeqBatchItem]
    ) -> tuple[tuple[str, ...], torch.Tensor | None]:
        """Steps 1-3: the sampled requests' ids and their logits ([num_sampled, vocab])."""
        inputs = self.prepare_inputs(items)
        self.last_inputs = inputs
        self.set_active_loras(items)
        block_tables, slot_mappings = self.prepare_attn(inputs)
        self.last_step = step = build_paged_step(
            build_attn_metadata(
                num_reqs=inputs.num_reqs,
                num_tokens=inputs.num_actual_tokens,
                query_start_loc=torch.tensor(inputs.query_start_loc, dtype=torch.long),
                max_query_len=inputs.max_query_len,
                seq_lens=torch.tensor(inputs.seq_lens, dtype=torch.long),
                max_seq_len=inputs.max_seq_len,
                block_tables=block_tables,
                slot_mappings=slot_mappings,
            ),
            self.group_sliding_window,
            self.kv_caches,
            self.layer_group,
            self.block_size,
            self.num_kv_heads,
            self.num_heads // self.num_kv_heads,
            self.device,
            self.dtype,
            self._pool_views,
            self.state_groups,
        )
        for g in self.state_groups:
            step.state_metadata[g] = state_step_metadata(
                inputs.query_start_loc, inputs.seq_lens, inputs.block_table[g], self.block_size
            )
        dev = self.device
        input_ids = torch.tensor([inputs.input_ids], dtype=torch.long).to(dev)
        rows = [r for it in items for r in (it.embeds or (None,) * len(it.token_ids))]
        if any(r is not None for r in rows):
            fed = {"inputs_embeds": self._inputs_embeds(input_ids, rows)}
        else:
            fed = {"input_ids": input_ids}
        out = self.model(
            **fed,
            position_ids=torch.tensor([inputs.positions], dtype=torch.long).to(dev),
            logits_to_keep=torch.tensor(inputs.logits_indices, dtype=torch.long).to(dev),
            use_cache=False,
            paged_step=step,
        )
        # a prefill chunk that samples nothing still ran: its K/V is in the pool now
        return inputs.sample_req_ids, (out.logits[0] if inputs.sample_req_ids else None)

    def _inputs_embeds(self, input_ids: torch.Tensor, rows: list) -> torch.Tensor:
        """The step's ``inputs_embeds`` ([1, num_tokens, hidden]): each token's own embedding,
        replaced by its given row where it has one (vLLM's runner with prompt embeddings or
        multimodal items: the embedding of the ids, then the rows written over their positions).
        A row is raw bytes in the model's dtype; ValueError when one is not ``hidden`` wide."""
        embeds = self.model.get_input_embeddings()(input_ids)
        at = [i for i, r in enumerate(rows) if r is not None]
        data = b"".join(rows[i] for i in at)
        width = embeds.shape[-1] * embeds.element_size()
        if any(len(rows[i]) != width for i in at):
            raise ValueError(f"an embedding row is not {width} bytes (hidden size x dtype)")
        given = torch.frombuffer(bytearray(data), dtype=self.dtype).view(len(at), -1)
        embeds[0, at] = given.to(embeds.device)
        return embeds

    @torch.inference_mode()
    def execute_logits(self, items: Sequence[SeqBatchItem]) -> dict[str, torch.Tensor]:
        """Run one step; last-position logits (float32, CPU, [vocab]) of each item with
        sample=True."""
        if not items:
            return {}
        rids, logits = self._forward(items)
        if logits is None:
            return {}
        logits = logits.float().cpu()
        return {r: logits[i].clone() for i, r in enumerate(rids)}

    @torch.inference_mode()
    def execute(self, items: Sequence[SeqBatchItem]) -> dict[str, int]:
        """Run one step; the next token of each item with sample=True."""
        if not items:
            return {}
        rids, logits = self._forward(items)
        if logits is None:
            return {}
        if not self.request_generators:
            if self._generator is None:
                next_ids = torch.argmax(logits, dim=-1).tolist()
            else:
                probs = torch.softmax(logits.float(), dim=-1)
                next_ids = torch.multinomial(probs, 1, generator=self._generator)[:, 0].tolist()
        else:
            next_ids = []
            for i, rid in enumerate(rids):
                gen = self.request_generators.get(rid, self._generator)
                if gen is None:
                    next_ids.append(int(torch.argmax(logits[i])))
                else:
                    probs = torch.softmax(logits[i].float(), dim=-1)
                    next_ids.append(int(torch.multinomial(probs, 1, generator=gen)))
        return dict(zip(rids, next_ids))

    def keep_hidden_states(self) -> None:
        """From now on ``execute_verify`` keeps what the LM head reads at each logits position
        (``last_hidden_states``): the target's hidden states an EAGLE drafter drafts from."""
        if self._hidden_hook is None:

            def keep(module, args, output):
                self._lm_head_input = args[0]

            self._hidden_hook = self.model.lm_head.register_forward_hook(keep)

    @torch.inference_mode()
    def execute_verify(self, items: Sequence[SeqBatchItem]) -> dict[str, list[int]]:
        """Run one step; greedy tokens after each logits position of each item with sample=True:
        one for a plain item, 1 + num_draft_tokens for one carrying drafts (speculative
        decoding)."""
        if not items:
            return {}
        self._lm_head_input = None
        self.last_hidden_states = {}
        rids, logits = self._forward(items)
        if logits is None:
            return {}
        out: dict[str, list[int]] = {}
        for rid, token in zip(rids, torch.argmax(logits, dim=-1).tolist()):
            out.setdefault(rid, []).append(token)
        if self._lm_head_input is not None:
            rows = self._lm_head_input[0]
            at = 0
            for rid, tokens in out.items():  # a request's rows are consecutive, in this order
                self.last_hidden_states[rid] = rows[at : at + len(tokens)]
                at += len(tokens)
        return out
