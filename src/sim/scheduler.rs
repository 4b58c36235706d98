//! One modelled worker of [`Engine::Batched`](super::Engine::Batched): vLLM's v1 scheduler
//! over a [`BlockPool`], one step at a time.
//!
//! Glossary: a **sequence** is a request on the worker; its **tokens** are the prompt's and
//! those it has generated; **computed** tokens have their KV in the sequence's blocks. A
//! sequence is **waiting** (not yet admitted, or preempted) or **running**.
//!
//! A step, as vLLM's `Scheduler.schedule` builds it (facts taken from vLLM, code not):
//! 1. running sequences in admission order each get their next tokens under the step's
//!    token budget: a partially prefilled one the rest of its prompt (a chunk, as the budget
//!    allows), a decoding one one token. When the pool cannot give a sequence the blocks
//!    for them, the most recently admitted running sequence is preempted (its blocks freed,
//!    its computed tokens forgotten, itself put back at the head of the waiting queue),
//!    until the blocks fit or the sequence itself was preempted;
//! 2. unless a sequence was preempted while others still run (an empty step would leave the
//!    worker idle with requests waiting), waiting sequences in arrival order are admitted
//!    while budget and the sequence cap allow: each first takes the longest cached prefix
//!    of its tokens (never its last token: vLLM always computes it, so a fully cached
//!    prompt computes its last block), continued by whole chunks of the host tier if the
//!    worker has one ([`HostTier`], loaded back into new blocks at their reload time), then
//!    a prefill chunk within the budget, and is admitted only when the pool has the blocks;
//! 3. at the step's end every computed full block is cached under its hash (and copied to
//!    the host tier, chunk by chunk); a sequence
//!    whose prompt is done samples a token (its first token when the prompt just finished);
//!    one that has all its output tokens finishes and frees its blocks last first.
//!
//! What is left out: speculative decoding, priorities, the encoder cache, prompt logprobs,
//! structured output, the async scheduler's overlap of steps, and a request longer than
//! the pool (it is rejected at admission instead of waiting forever).

use std::collections::VecDeque;

use super::config::BatchConfig;
use super::host::{HostChange, HostTier};
use super::pool::{BlockId, BlockPool, PoolLog};
use crate::hash::{BlockHash, PrefixHasher, TokenId};

/// A sequence's index in the run (its request's index in the trace).
pub(super) type SeqId = usize;

/// A request on a worker.
#[derive(Clone, Debug)]
pub(super) struct Seq {
    /// Prompt tokens.
    pub(super) prompt: Vec<TokenId>,
    /// Hashes of the sequence's full blocks so far: the prompt's, then those completed by
    /// generated tokens (unique to the sequence).
    pub(super) hashes: Vec<BlockHash>,
    /// Output tokens to generate (at least 1).
    pub(super) output: u32,
    /// Tokens generated so far.
    pub(super) generated: u32,
    /// Tokens whose KV is computed.
    pub(super) computed: usize,
    /// The sequence's blocks, in token order.
    blocks: Vec<BlockId>,
    /// Leading blocks already cached in the pool under their hashes.
    cached_blocks: usize,
    /// Prompt tokens found cached at the first admission.
    pub(super) hit_tokens: Option<usize>,
    /// Times preempted.
    pub(super) preemptions: u32,
    /// Whether the prompt's KV was computed on another worker and is on this one by its
    /// first admission (a decode leg of a disaggregated request): see
    /// [`Scheduler::admit_waiting`]. Cleared by a preemption: the worker then recomputes
    /// what it lost, as vLLM pulls a request's KV once.
    pub(super) remote_prefix: bool,
}

impl Seq {
    /// A sequence of `prompt` (hashed into `hashes`, one per full block) generating
    /// `output` tokens (at least one).
    pub(super) fn new(prompt: Vec<TokenId>, hashes: Vec<BlockHash>, output: u32) -> Self {
        Self {
            prompt,
            hashes,
            output: output.max(1),
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            cached_blocks: 0,
            hit_tokens: None,
            preemptions: 0,
            remote_prefix: false,
        }
    }

    /// Prompt and generated tokens.
    pub(super) fn len(&self) -> usize {
        self.prompt.len() + self.generated as usize
    }

    /// Tokens the next step would compute without a budget.
    fn pending(&self) -> usize {
        self.len() - self.computed
    }

    /// Writes the tokens of block `b` (full) of sequence `id` into `out`: the prompt's,
    /// then generated ones, which the model makes up (seeded by the sequence and position,
    /// so that no two sequences generate the same block).
    fn block_tokens(&self, id: SeqId, b: usize, block_size: usize, out: &mut Vec<TokenId>) {
        out.clear();
        out.extend(
            (b * block_size..(b + 1) * block_size).map(|pos| match self.prompt.get(pos) {
                Some(&t) => t,
                None => generated_token(id, pos),
            }),
        );
    }
}

/// The made-up token sequence `id` generates at position `pos`.
fn generated_token(id: SeqId, pos: usize) -> TokenId {
    let mixed = crate::fold::mix64(((id as u64) << 32) ^ pos as u64 ^ 0x6E65_7854_6F6B_656E);
    (mixed % 151_936) as TokenId
}

/// What happened to a sequence in a finished step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Its prompt finished: its first token.
    FirstToken(SeqId),
    /// It generated its last token and left the worker.
    Finished(SeqId),
    /// It was admitted for the first time, finding `hit` prompt tokens cached, `host` of
    /// them loaded back from the host tier.
    Admitted { seq: SeqId, hit: usize, host: usize },
    /// It generated a multiple of the host's progress cadence of output tokens, short of its
    /// last: the host reports its stream's progress.
    Progress(SeqId),
    /// It was preempted.
    Preempted(SeqId),
    /// It can never fit in the pool and was dropped.
    Rejected(SeqId),
}

/// The work of one step.
#[derive(Clone, Debug, Default)]
pub(super) struct Step {
    /// Sequences and the tokens each computes.
    pub(super) work: Vec<(SeqId, usize)>,
    /// Prompt tokens computed.
    pub(super) prefill: usize,
    /// Pairs the prefill chunks attend to: `Σ L·(E + L/2)` over chunks of `L` tokens after
    /// `E` of their request's tokens in KV.
    pub(super) attended: f64,
    /// Decoding sequences.
    pub(super) decodes: usize,
    /// Tokens of context the decodes attend to.
    pub(super) context: usize,
    /// Tokens loaded back from the host tier.
    pub(super) loaded: usize,
    /// The worker's KV capacity in tokens (its pool's blocks times their size): the decodes'
    /// KV usage is `context` over it, for a profile timing decodes by usage.
    pub(super) kv_capacity_tokens: usize,
}

impl Step {
    /// The step's duration under `config` (its profile, else its step model at
    /// `prefill_tokens_per_s`), before the worker's speed and jitter.
    pub(super) fn duration(&self, config: &BatchConfig, prefill_tokens_per_s: f64) -> f64 {
        let (prefill, decodes) = (self.prefill as f64, self.decodes as f64);
        let compute = match &config.profile {
            Some(profile) => profile.step_s(
                prefill,
                self.attended,
                decodes,
                self.context as f64,
                self.kv_capacity_tokens as f64,
            ),
            None => {
                config
                    .step
                    .seconds(prefill, decodes, self.context as f64, prefill_tokens_per_s)
            }
        };
        compute + config.reload.seconds(crate::tree::Tier::Host, self.loaded)
    }
}

/// One worker's scheduler and pool.
#[derive(Debug)]
pub(super) struct Scheduler {
    pool: BlockPool,
    host: Option<HostTier>,
    block_size: usize,
    config: BatchConfig,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    /// The blocks the sequence being admitted hits (reused from one admission to the next).
    hit: Vec<BlockId>,
    /// Every how many output tokens a running sequence reports progress (0: never).
    progress_every: u32,
}

impl Scheduler {
    /// A worker of `blocks` blocks of `block_size` tokens, recording its pool's changes
    /// when `record` is true.
    pub(super) fn new(blocks: usize, block_size: usize, config: BatchConfig, record: bool) -> Self {
        let chunk_tokens = config.host_chunk_blocks.max(1) * block_size;
        let host_chunks = config.host_capacity_tokens / chunk_tokens.max(1);
        Self {
            pool: BlockPool::new(blocks, record),
            host: (host_chunks > 0)
                .then(|| HostTier::new(host_chunks, config.host_chunk_blocks, record)),
            block_size,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            hit: Vec::new(),
            progress_every: 0,
        }
    }

    /// Reports progress every `every` output tokens after the first (0: never).
    pub(super) fn with_progress_every(mut self, every: u32) -> Self {
        self.progress_every = every;
        self
    }

    /// Queues a new sequence.
    pub(super) fn enqueue(&mut self, seq: SeqId) {
        self.waiting.push_back(seq);
    }

    /// Whether any sequence is waiting or running.
    pub(super) fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// The sequences on the worker, waiting then running.
    pub(super) fn seqs(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.waiting.iter().chain(&self.running).copied()
    }

    /// The load an engine's metrics would show at `now` (seconds): sequences waiting and
    /// running, the pool's blocks not free (vLLM's KV-cache usage: cached free blocks count
    /// as free), and the prompt tokens still to prefill (a waiting sequence's past the
    /// prefix the pool holds for it now).
    pub(super) fn load(&self, seqs: &[Option<Seq>], now: f64) -> crate::fleet::EngineLoad {
        let capacity = self.pool.capacity().max(1);
        let used = capacity.saturating_sub(self.pool.free_blocks());
        let pending = |id: &SeqId| {
            let Some(seq) = seqs.get(*id).and_then(Option::as_ref) else {
                return 0;
            };
            if seq.remote_prefix {
                return 0;
            }
            let computed = if seq.computed == 0 {
                self.pool.cached_prefix(&seq.hashes) * self.block_size
            } else {
                seq.computed
            };
            seq.prompt.len().saturating_sub(computed) as u64
        };
        let prefill: u64 = self.waiting.iter().chain(&self.running).map(pending).sum();
        crate::fleet::EngineLoad::new(
            self.waiting.len() as u64,
            self.running.len() as u64,
            std::time::Duration::from_secs_f64(now.max(0.0)),
        )
        .with_kv_blocks(used as u64, capacity as u64)
        .with_prefill_tokens(prefill)
    }

    /// How many leading `hashes` the pool and the host tier would give a request.
    #[cfg(test)]
    pub(super) fn cached_prefix(&self, hashes: &[BlockHash]) -> usize {
        let hit = self.pool.cached_prefix(hashes);
        self.host
            .as_ref()
            .map_or(hit, |h| h.continues(hashes, hit, hashes.len()))
    }

    /// The pool's changes and the host tier's since the last call (every host change came
    /// after the pool changes it follows: a chunk is copied once its blocks are cached).
    pub(super) fn drain_changes(&mut self) -> (PoolLog, Vec<HostChange>) {
        let host = self
            .host
            .as_mut()
            .map(HostTier::drain_changes)
            .unwrap_or_default();
        (self.pool.drain_changes(), host)
    }

    /// Builds the next step, admitting and preempting as it goes (see the module docs).
    pub(super) fn schedule(&mut self, seqs: &mut [Option<Seq>], out: &mut Vec<Outcome>) -> Step {
        let mut step = Step {
            kv_capacity_tokens: self.pool.capacity().saturating_mul(self.block_size),
            ..Step::default()
        };
        let mut budget = self.config.step.max_num_batched_tokens;
        let preempted = self.schedule_running(seqs, &mut budget, &mut step, out);
        // A step with nothing running admits even after a preemption: an empty step would
        // leave the worker idle with requests waiting, and nothing would wake it.
        if !preempted || step.work.is_empty() {
            self.admit_waiting(seqs, &mut budget, &mut step, out);
        }
        step
    }

    /// Step 1 of the module docs; whether a sequence was preempted.
    fn schedule_running(
        &mut self,
        seqs: &mut [Option<Seq>],
        budget: &mut usize,
        step: &mut Step,
        out: &mut Vec<Outcome>,
    ) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let Some(seq) = seqs[id].as_ref() else {
                self.running.remove(i);
                continue;
            };
            let tokens = seq.pending().min(*budget);
            let need = self.blocks_needed(seq, tokens);
            if !self.make_room(id, need, seqs, out, &mut preempted) {
                break;
            }
            let seq = seqs[id]
                .as_ref()
                .unwrap_or_else(|| unreachable!("checked above"));
            Self::account(step, id, seq, tokens);
            *budget -= tokens;
            i += 1;
        }
        preempted
    }

    /// Gives running sequence `id` `need` more blocks, preempting the most recently
    /// admitted running sequences until they fit; `false` when `id` itself was preempted.
    fn make_room(
        &mut self,
        id: SeqId,
        need: usize,
        seqs: &mut [Option<Seq>],
        out: &mut Vec<Outcome>,
        preempted: &mut bool,
    ) -> bool {
        loop {
            let Some(seq) = seqs[id].as_mut() else {
                return false;
            };
            if self.pool.allocate(need, &mut seq.blocks) {
                return true;
            }
            let victim = self.running.pop().unwrap_or(id);
            self.preempt(victim, seqs, out);
            *preempted = true;
            if victim == id {
                return false;
            }
        }
    }

    /// Step 2 of the module docs. A sequence whose prompt's KV came from another worker
    /// ([`Seq::remote_prefix`]) takes its cached prefix as hits and new blocks for the rest
    /// of its prompt, which it holds loaded, not computed (its host tier is not asked): it
    /// computes only its last prompt token, a decode in the step, and samples its first
    /// token at the step's end, when those blocks are cached (as vLLM recomputes the last
    /// token of a prompt whose KV it pulled whole).
    fn admit_waiting(
        &mut self,
        seqs: &mut [Option<Seq>],
        budget: &mut usize,
        step: &mut Step,
        out: &mut Vec<Outcome>,
    ) {
        while *budget > 0 && self.running.len() < self.config.step.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                return;
            };
            let Some(seq) = seqs[id].as_mut() else {
                self.waiting.pop_front();
                continue;
            };
            if seq.len().div_ceil(self.block_size) > self.pool.capacity() {
                self.waiting.pop_front();
                out.push(Outcome::Rejected(id));
                continue;
            }
            let (hit, found) = self.find_prefix(seq);
            let computed = if seq.remote_prefix {
                seq.len() - 1
            } else {
                found * self.block_size
            };
            let tokens = (seq.len() - computed).min(*budget);
            let need = (computed + tokens).div_ceil(self.block_size) - hit;
            if need + self.pool.free_among(&self.hit) > self.pool.free_blocks() {
                return;
            }
            self.waiting.pop_front();
            if let Some(host) = &mut self.host {
                host.load(&seq.hashes, found);
            }
            self.pool.take(&self.hit, &mut seq.blocks);
            let fitted = self.pool.allocate(need, &mut seq.blocks);
            debug_assert!(fitted, "checked above");
            seq.computed = computed;
            seq.cached_blocks = hit;
            step.loaded += (found - hit) * self.block_size;
            if seq.hit_tokens.is_none() {
                let hit_tokens = (found * self.block_size).min(seq.prompt.len());
                seq.hit_tokens = Some(hit_tokens);
                out.push(Outcome::Admitted {
                    seq: id,
                    hit: hit_tokens,
                    host: hit_tokens.saturating_sub(hit * self.block_size),
                });
            }
            Self::account(step, id, seq, tokens);
            *budget -= tokens;
            self.running.push(id);
        }
    }

    /// The blocks `seq` would find on admission, never covering its last token: the pool's
    /// hits (left in `self.hit`) and how far the host tier continues them (not for a
    /// sequence whose KV came from another worker), as block counts.
    fn find_prefix(&mut self, seq: &Seq) -> (usize, usize) {
        let max_hit = (seq.len() - 1) / self.block_size;
        let hashes = &seq.hashes[..max_hit.min(seq.hashes.len())];
        self.pool.hit_blocks(hashes, &mut self.hit);
        let hit = self.hit.len();
        let found = match &self.host {
            Some(h) if !seq.remote_prefix => h.continues(&seq.hashes, hit, max_hit),
            _ => hit,
        };
        (hit, found)
    }

    /// Prompt tokens of `hashes` (a prompt of `prompt_tokens` tokens) the pool would give a
    /// request now, never its last token: what a decode worker holds of a prompt whose KV
    /// comes from elsewhere, the rest being what moves.
    pub(super) fn pool_prefix_tokens(&self, hashes: &[BlockHash], prompt_tokens: usize) -> usize {
        let max_hit = prompt_tokens.saturating_sub(1) / self.block_size;
        self.pool
            .cached_prefix(&hashes[..max_hit.min(hashes.len())])
            * self.block_size
    }

    /// New blocks `seq` needs to compute `tokens` more tokens.
    fn blocks_needed(&self, seq: &Seq, tokens: usize) -> usize {
        (seq.computed + tokens)
            .div_ceil(self.block_size)
            .saturating_sub(seq.blocks.len())
    }

    /// Adds `tokens` of `seq` to the step.
    fn account(step: &mut Step, id: SeqId, seq: &Seq, tokens: usize) {
        step.work.push((id, tokens));
        // A decode computes the last sampled token of a finished prompt, or the last prompt
        // token of a prompt whose KV came whole from another worker; anything else (prompt
        // chunks, a preempted sequence's recomputation) is prefill work.
        let remote_first = seq.remote_prefix && seq.generated == 0;
        if tokens == 1
            && seq.pending() == 1
            && (remote_first || (seq.generated > 0 && seq.computed >= seq.prompt.len()))
        {
            step.decodes += 1;
            step.context += seq.computed + tokens;
        } else {
            step.prefill += tokens;
            step.attended += tokens as f64 * (seq.computed as f64 + tokens as f64 / 2.0);
        }
    }

    /// Frees `id`'s blocks and puts it back at the head of the waiting queue.
    fn preempt(&mut self, id: SeqId, seqs: &mut [Option<Seq>], out: &mut Vec<Outcome>) {
        self.running.retain(|&r| r != id);
        if let Some(seq) = seqs[id].as_mut() {
            self.pool.free(seq.blocks.drain(..).rev());
            seq.computed = 0;
            seq.cached_blocks = 0;
            seq.preemptions += 1;
            seq.remote_prefix = false;
        }
        self.waiting.push_front(id);
        out.push(Outcome::Preempted(id));
    }

    /// Ends `step`: computed tokens advance, full blocks are cached (hashed by `hasher`,
    /// chained, past the prompt's), tokens are sampled, finished sequences leave.
    pub(super) fn finish_step(
        &mut self,
        step: &Step,
        seqs: &mut [Option<Seq>],
        hasher: &PrefixHasher,
        out: &mut Vec<Outcome>,
    ) {
        let mut tokens_buf = Vec::new();
        for &(id, tokens) in &step.work {
            let Some(seq) = seqs[id].as_mut() else {
                continue;
            };
            seq.computed += tokens;
            self.cache_full_blocks(id, seq, hasher, &mut tokens_buf);
            if seq.computed < seq.len() {
                continue; // a prefill chunk short of the prompt's end
            }
            seq.generated += 1;
            if seq.generated == 1 {
                out.push(Outcome::FirstToken(id));
            }
            let every = self.progress_every;
            if every > 0 && seq.generated > 1 && seq.generated < seq.output {
                let after = seq.generated - 1;
                if after % every == 0 {
                    out.push(Outcome::Progress(id));
                }
            }
            if seq.generated >= seq.output {
                self.running.retain(|&r| r != id);
                self.pool.free(seq.blocks.drain(..).rev());
                out.push(Outcome::Finished(id));
            }
        }
    }

    /// Caches `seq`'s computed full blocks not cached yet.
    fn cache_full_blocks(
        &mut self,
        id: SeqId,
        seq: &mut Seq,
        hasher: &PrefixHasher,
        tokens: &mut Vec<TokenId>,
    ) {
        let full = seq.computed / self.block_size;
        let record = self.pool.records();
        for b in seq.cached_blocks..full {
            let unhashed = seq.hashes.len() == b;
            tokens.clear();
            if unhashed || record {
                seq.block_tokens(id, b, self.block_size, tokens);
            }
            if unhashed {
                let parent = b.checked_sub(1).map_or(hasher.root(&[]), |p| seq.hashes[p]);
                hasher.continue_from(parent, tokens, &mut seq.hashes);
            }
            let parent = b.checked_sub(1).map(|p| seq.hashes[p]);
            self.pool
                .cache(seq.blocks[b], seq.hashes[b], parent, tokens);
        }
        if let Some(host) = &mut self.host {
            host.copy(&seq.hashes, seq.cached_blocks, full);
        }
        seq.cached_blocks = seq.cached_blocks.max(full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outcomes of running one sequence of `output` tokens to its end on a worker that
    /// reports progress every `every` tokens: each progress report with the tokens
    /// generated then.
    fn progress_of(output: u32, every: u32) -> Vec<u32> {
        let hasher = PrefixHasher::new(16).expect("block size");
        let prompt: Vec<TokenId> = (0..64).collect();
        let hashes = hasher.hash(&prompt);
        let mut seqs = vec![Some(Seq::new(prompt, hashes, output))];
        let mut scheduler =
            Scheduler::new(1_000, 16, BatchConfig::default(), false).with_progress_every(every);
        scheduler.enqueue(0);
        let (mut out, mut reports) = (Vec::new(), Vec::new());
        while scheduler.has_work() {
            let step = scheduler.schedule(&mut seqs, &mut out);
            scheduler.finish_step(&step, &mut seqs, &hasher, &mut out);
            for o in out.drain(..) {
                if let Outcome::Progress(id) = o {
                    reports.push(seqs[id].as_ref().map_or(0, |s| s.generated));
                }
            }
        }
        reports
    }

    #[test]
    fn progress_is_reported_every_n_tokens_after_the_first_short_of_the_last() {
        assert_eq!(progress_of(40, 16), vec![17, 33]);
        assert_eq!(
            progress_of(33, 16),
            vec![17],
            "the last token is the end, not progress"
        );
        assert_eq!(progress_of(40, 0), Vec::<u32>::new(), "0: only the end");
        assert_eq!(progress_of(1, 1), Vec::<u32>::new());
    }
}
