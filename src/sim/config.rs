//! The modelled fleet's configuration.

use crate::config::{float, int};
use crate::error::Error;
use crate::hash::PrefixHasher;
use crate::pd::Role;
use crate::request::Priority;
use crate::tree::RadixTree;

/// How the router's mirror is corrected during a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SyncMode {
    /// Nothing: the router keeps its optimistic mirror, bounded by its own configuration
    /// (for example [`IndexConfig::worker_capacity_blocks`](crate::IndexConfig)). The
    /// default.
    #[default]
    None,
    /// Miss feedback: when a request is admitted, its worker reports how many prompt tokens
    /// it found cached ([`CacheSync::report_cached`](crate::CacheSync::report_cached)),
    /// which trims what the mirror predicted beyond that.
    Feedback,
    /// Engine events: each worker publishes the blocks its pool caches and evicts, per
    /// step, and the router applies them ([`CacheSync::apply_event`](crate::CacheSync::apply_event)).
    /// With [`Engine::Batched`] only (the simple engine keeps no pool); delivered at the
    /// end of the step that made them.
    Events,
}

/// One modelled worker of a mixed fleet: its speed relative to the configured rates, its
/// KV capacity, and its role in a disaggregated fleet
/// ([`Simulation::run_pd`](super::Simulation::run_pd)).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerSpec {
    /// Relative speed: 0.5 computes at half the configured prefill rate and takes twice the
    /// configured step and decode times.
    pub speed: f64,
    /// KV capacity in tokens.
    pub capacity_tokens: usize,
    /// What it does in a disaggregated fleet. Default [`Role::Both`], the only role a run
    /// through a plain [`Router`](crate::Router) accepts.
    pub role: Role,
}

impl WorkerSpec {
    /// A worker of relative `speed` holding `capacity_tokens` tokens of KV, prefilling and
    /// decoding ([`Role::Both`]).
    #[must_use]
    pub fn new(speed: f64, capacity_tokens: usize) -> Self {
        Self {
            speed,
            capacity_tokens,
            role: Role::Both,
        }
    }

    /// The same worker with `role`.
    #[must_use]
    pub fn with_role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// Parses a fleet as `simulate --fleet` writes it: comma-separated groups
    /// `COUNTx[ROLE][SPEED][@CAPACITY_TOKENS]`, where `ROLE` is `P` (prefill only) or `D`
    /// (decode only) and no role means both, `SPEED` defaults to 1.0 after a role (and is
    /// required without one), and the capacity defaults to `default_capacity_tokens`.
    /// `4x1.0,4x0.5@2000000` is four workers at the configured speed and four at half of it
    /// with 2,000,000 tokens of KV each; `2xP,6xD` two prefill and six decode workers;
    /// `2xP0.5@100000` two half-speed prefill workers of 100,000 tokens.
    ///
    /// ```
    /// use prefix_router::Role;
    /// use prefix_router::sim::WorkerSpec;
    ///
    /// let fleet = WorkerSpec::parse_fleet("1xP0.5@4096,2xD,1x2.0", 1_000)?;
    /// assert_eq!(fleet[0], WorkerSpec::new(0.5, 4_096).with_role(Role::Prefill));
    /// assert_eq!(fleet[1], WorkerSpec::new(1.0, 1_000).with_role(Role::Decode));
    /// assert_eq!(fleet[3], WorkerSpec::new(2.0, 1_000));
    /// assert!(WorkerSpec::parse_fleet("2xQ", 1_000).is_err());
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the group that does not parse, or whose count is 0,
    /// role letter unknown, speed not positive and finite, or capacity not a number.
    pub fn parse_fleet(
        spec: &str,
        default_capacity_tokens: usize,
    ) -> Result<Vec<WorkerSpec>, Error> {
        let mut fleet = Vec::new();
        for group in spec.split(',') {
            let (count, worker) =
                Self::parse_group(group, default_capacity_tokens).ok_or_else(|| {
                    crate::config::invalid(
                        "fleet",
                        group.to_owned(),
                        "groups COUNTx[P|D][SPEED][@CAPACITY_TOKENS] (a speed without a role), \
                         count at least 1, speed positive",
                    )
                })?;
            fleet.extend((0..count).map(|_| worker));
        }
        Ok(fleet)
    }

    /// One group of [`parse_fleet`](Self::parse_fleet): its count and worker; `None` when it
    /// does not parse or is out of range.
    fn parse_group(group: &str, default_capacity_tokens: usize) -> Option<(u32, WorkerSpec)> {
        let (head, capacity) = match group.split_once('@') {
            Some((head, c)) => (head, c.trim().parse().ok()?),
            None => (group, default_capacity_tokens),
        };
        let (count, rest) = head.split_once('x')?;
        let count: u32 = count.trim().parse().ok()?;
        let rest = rest.trim();
        let (role, speed) = match rest.strip_prefix('P') {
            Some(speed) => (Role::Prefill, speed),
            None => match rest.strip_prefix('D') {
                Some(speed) => (Role::Decode, speed),
                None if rest.is_empty() => return None,
                None => (Role::Both, rest),
            },
        };
        let speed = speed.trim();
        let speed: f64 = if speed.is_empty() {
            1.0
        } else {
            speed.parse().ok()?
        };
        (count > 0 && speed.is_finite() && speed > 0.0)
            .then(|| (count, WorkerSpec::new(speed, capacity).with_role(role)))
    }
}

/// A worker's outage ([`Simulation::with_faults`](super::Simulation::with_faults)): at
/// `down_s` the worker leaves (every router replica removes it; its running and waiting
/// requests fail and are routed again); at `up_s` it returns with an empty cache, its
/// engine's event sequence starting again at 0, and every replica adds it back. Times are
/// simulated seconds, after [`ClusterConfig::speedup`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Fault {
    /// The worker.
    pub worker: u32,
    /// When it leaves.
    pub down_s: f64,
    /// When it returns (`f64::INFINITY`: never).
    pub up_s: f64,
}

impl Fault {
    /// `worker` leaves at `down_s` and returns at `up_s`.
    #[must_use]
    pub fn new(worker: u32, down_s: f64, up_s: f64) -> Self {
        Self {
            worker,
            down_s,
            up_s,
        }
    }

    /// Parses `W@DOWN-UP` (worker `W` down from `DOWN` to `UP` seconds; `UP` may be `inf`),
    /// several separated by commas.
    ///
    /// ```
    /// use prefix_router::sim::Fault;
    ///
    /// let faults = Fault::parse_schedule("3@60-120,5@90-inf")?;
    /// assert_eq!(faults[0], Fault::new(3, 60.0, 120.0));
    /// assert!(faults[1].up_s.is_infinite());
    /// # Ok::<(), prefix_router::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a malformed entry.
    pub fn parse_schedule(spec: &str) -> Result<Vec<Fault>, crate::error::Error> {
        spec.split(',')
            .map(|entry| {
                let bad =
                    || crate::config::invalid("faults", entry, "W@DOWN-UP, for example 3@60-120");
                let (worker, times) = entry.trim().split_once('@').ok_or_else(bad)?;
                let (down, up) = times.split_once('-').ok_or_else(bad)?;
                let up = if up == "inf" {
                    Ok(f64::INFINITY)
                } else {
                    up.parse()
                };
                Ok(Fault::new(
                    worker.parse().map_err(|_| bad())?,
                    down.parse().map_err(|_| bad())?,
                    up.map_err(|_| bad())?,
                ))
            })
            .collect()
    }

    /// Checks the fault against a fleet of `workers` workers.
    pub(super) fn validate(&self, workers: usize) -> Result<(), crate::error::Error> {
        if self.worker as usize >= workers {
            return Err(crate::config::invalid(
                "faults",
                self.worker,
                "a worker of the fleet",
            ));
        }
        crate::config::float(
            "faults",
            self.down_s,
            0.0..=f64::MAX,
            "a finite time, 0 or later",
        )?;
        if self.up_s.is_nan() || self.up_s <= self.down_s {
            return Err(crate::config::invalid(
                "faults",
                self.up_s,
                "a return after the worker leaves",
            ));
        }
        Ok(())
    }
}

/// How requests are spread over router replicas
/// ([`Simulation::run_replicas`](super::Simulation::run_replicas)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Front {
    /// Each request to the next replica in turn. The default.
    #[default]
    RoundRobin,
    /// Each request to a replica drawn at random (seeded by [`ClusterConfig::seed`]).
    Random,
}

/// When a workload's requests arrive ([`ClusterConfig::arrivals`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Arrivals {
    /// At the times the workload or trace records. The default.
    #[default]
    Recorded,
    /// Each recorded instant's requests spread uniformly over the gap to the next instant
    /// (seeded by [`ClusterConfig::seed`], in the recorded order): for traces whose times are
    /// binned (the Mooncake conversation trace's requests arrive at instants 3 s apart, up
    /// to 28 at once), so that a burst of same-instant requests is not an artefact of the
    /// recording.
    Spread,
}

/// How a modelled worker runs its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Engine {
    /// One prefill at a time from a FIFO queue, decoding free beside it, the cache an LRU
    /// over blocks that holds nothing for running requests. Fast; the default.
    #[default]
    Simple,
    /// Iteration-level, as vLLM's v1 scheduler runs: continuous batching under a token
    /// budget, chunked prefill, a block pool where running requests hold their blocks,
    /// preemption when it is full, and a step time from [`BatchConfig`].
    Batched,
}

/// Settings of [`Engine::Batched`], per worker.
///
/// A step's time is [`StepModel::seconds`](crate::StepModel::seconds) at
/// [`ClusterConfig::prefill_tokens_per_s`] (divided by the worker's speed), plus the time to
/// load back what it takes from the host tier. The routers predict with the same model
/// ([`LoadConfig::step`](crate::LoadConfig::step)): with its defaults a lone 2,000-token
/// prefill takes 69 ms and a lone decode step 8 ms.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct BatchConfig {
    /// The scheduler's budgets and the step-time model.
    pub step: crate::fleet::StepModel,
    /// KV each worker's host tier (CPU offloading) holds, in tokens; 0: no host tier.
    /// Default 0.
    pub host_capacity_tokens: usize,
    /// Blocks per chunk of the host tier (vLLM's offloaded block size over its GPU block
    /// size): copied and loaded whole. At least 1; default 1. Give the routers' mirrors the
    /// same ([`IndexConfig::host_chunk_blocks`](crate::IndexConfig::host_chunk_blocks)).
    pub host_chunk_blocks: usize,
    /// What loading from the host tier costs: a step that loads `n` tokens back takes
    /// [`ReloadConfig::seconds`](crate::ReloadConfig::seconds)`(Tier::Host, n)` longer.
    /// Default: the router's default figures.
    pub reload: crate::fleet::ReloadConfig,
    /// The step time of the engines, from an engine profile ([`EngineProfile`](super::EngineProfile)),
    /// each worker's step divided by its speed; `None` (the default): [`step`](Self::step)'s
    /// times at [`ClusterConfig::prefill_tokens_per_s`], the model the routers predict with
    /// by default.
    pub profile: Option<super::StepProfile>,
    /// The spread of each step's time: a step takes its profile's time times a lognormal
    /// factor of mean 1 and this log-scale deviation, drawn per worker from the run's seed.
    /// 0 or more; default 0 (no spread).
    pub step_jitter: f64,
    /// A spell in which every worker runs slower (a thermal throttle, a noisy neighbour, a
    /// storage stall); `None` (the default): none.
    pub slow_spell: Option<SlowSpell>,
}

/// From `from_s` to `to_s` (simulated seconds) every step that starts takes `factor` times
/// its time: the whole fleet slows, then recovers.
///
/// ```
/// use prefix_router::sim::SlowSpell;
///
/// let spell = SlowSpell::parse("30-60@10")?;
/// assert_eq!(spell, SlowSpell::new(30.0, 60.0, 10.0));
/// assert_eq!(spell.factor_at(45.0), 10.0);
/// assert_eq!(spell.factor_at(60.0), 1.0);
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct SlowSpell {
    /// When it starts.
    pub from_s: f64,
    /// When it ends.
    pub to_s: f64,
    /// How many times slower each step is, at least 1.
    pub factor: f64,
}

impl SlowSpell {
    /// Steps starting from `from_s` to `to_s` take `factor` times their time.
    #[must_use]
    pub fn new(from_s: f64, to_s: f64, factor: f64) -> Self {
        Self {
            from_s,
            to_s,
            factor,
        }
    }

    /// Parses `FROM-TO@FACTOR` (seconds, seconds, times slower).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a malformed spell or one [`validate`](Self::validate)
    /// refuses.
    pub fn parse(spec: &str) -> Result<Self, Error> {
        let bad =
            || crate::config::invalid("slow_spell", spec, "FROM-TO@FACTOR, for example 30-60@10");
        let (times, factor) = spec.trim().split_once('@').ok_or_else(bad)?;
        let (from, to) = times.split_once('-').ok_or_else(bad)?;
        let number = |s: &str| s.trim().parse::<f64>().map_err(|_| bad());
        let spell = Self::new(number(from)?, number(to)?, number(factor)?);
        spell.validate()?;
        Ok(spell)
    }

    /// The factor of a step starting at `now_s`: 1 outside the spell.
    #[must_use]
    pub fn factor_at(&self, now_s: f64) -> f64 {
        if (self.from_s..self.to_s).contains(&now_s) {
            self.factor
        } else {
            1.0
        }
    }

    /// Checks the spell.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a start that is negative or not finite, an end not
    /// after the start, or a factor below 1 or above 1,000.
    pub fn validate(&self) -> Result<(), Error> {
        float(
            "slow_spell",
            self.from_s,
            0.0..=f64::MAX,
            "a finite start, 0 or later",
        )?;
        if self.to_s.partial_cmp(&self.from_s) != Some(std::cmp::Ordering::Greater) {
            return Err(crate::config::invalid(
                "slow_spell",
                self.to_s,
                "an end after the start",
            ));
        }
        float(
            "slow_spell",
            self.factor,
            1.0..=1_000.0,
            "a factor from 1 to 1,000",
        )
    }
}

impl BatchConfig {
    crate::config::setters! {
        /// Sets [`step`](Self::step).
        with_step: step: crate::fleet::StepModel;
        /// Sets [`host_capacity_tokens`](Self::host_capacity_tokens).
        with_host_capacity_tokens: host_capacity_tokens: usize;
        /// Sets [`host_chunk_blocks`](Self::host_chunk_blocks).
        with_host_chunk_blocks: host_chunk_blocks: usize;
        /// Sets [`reload`](Self::reload).
        with_reload: reload: crate::fleet::ReloadConfig;
        /// Sets [`profile`](Self::profile).
        with_profile: profile: Option<super::StepProfile>;
        /// Sets [`step_jitter`](Self::step_jitter).
        with_step_jitter: step_jitter: f64;
        /// Sets [`slow_spell`](Self::slow_spell).
        with_slow_spell: slow_spell: Option<SlowSpell>;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a budget, sequence cap or host chunk of 0, a negative or
    /// NaN time, or a reload figure that is not positive.
    pub fn validate(&self) -> Result<(), Error> {
        int(
            "host_chunk_blocks",
            self.host_chunk_blocks,
            1..,
            "at least 1",
        )?;
        self.reload.validate()?;
        if let Some(profile) = &self.profile {
            profile.validate()?;
        }
        float(
            "step_jitter",
            self.step_jitter,
            0.0..=10.0,
            "a log-scale deviation from 0 to 10",
        )?;
        if let Some(spell) = &self.slow_spell {
            spell.validate()?;
        }
        self.step.validate()
    }
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            step: crate::fleet::StepModel::default(),
            host_capacity_tokens: 0,
            host_chunk_blocks: 1,
            reload: crate::fleet::ReloadConfig::default(),
            profile: None,
            step_jitter: 0.0,
            slow_spell: None,
        }
    }
}

/// The modelled fleet.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Workers. Default 8.
    pub workers: u32,
    /// KV cache of each worker, in tokens (LRU over blocks). Default 1,000,000 (about what
    /// one GPU holds for a 70B model).
    pub capacity_tokens: usize,
    /// Tokens per KV block. Default 16.
    pub block_size: usize,
    /// Prefill throughput of one worker. Default 33,000 tokens/s (about 60 ms for 2,000
    /// tokens of a 70B model on one H100).
    pub prefill_tokens_per_s: f64,
    /// Decode time per output token of [`Engine::Simple`] (decodes do not hold up its
    /// prefill queue). Default 0.02 s.
    pub decode_s_per_token: f64,
    /// How workers run requests. Default [`Engine::Simple`].
    pub engine: Engine,
    /// The batched engine's settings.
    pub batch: BatchConfig,
    /// Goodput's time-to-first-token target, seconds. Default 2.0.
    pub ttft_target_s: f64,
    /// Goodput's time-per-output-token target, seconds. Default 0.1.
    pub tpot_target_s: f64,
    /// Arrival rates are multiplied by this (arrival times divided). Default 1.0.
    pub speedup: f64,
    /// Mirror correction. Default [`SyncMode::None`].
    pub sync: SyncMode,
    /// Whether to time the router's decisions with the wall clock (the only
    /// non-deterministic figure of a report). Default true.
    pub measure_decision_time: bool,
    /// How requests are spread over router replicas. Default [`Front::RoundRobin`].
    pub front: Front,
    /// When requests arrive. Default [`Arrivals::Recorded`].
    pub arrivals: Arrivals,
    /// Every this many seconds each worker reports its load (requests waiting and running,
    /// KV in use) to every router replica
    /// ([`Router::report_load`](crate::Router::report_load)), so routers see load as stale
    /// as a metrics scrape leaves it; 0: never. Default 1.0.
    pub scrape_interval_s: f64,
    /// Time from a batch of engine events leaving a worker to its arrival at each router
    /// replica ([`SyncMode::Events`]). Default 0.
    pub event_delay_s: f64,
    /// Probability that a router replica never receives a batch of engine events: a gap in
    /// its sequence. Default 0.
    pub event_loss: f64,
    /// Whether a gap is repaired by a replay from the engine ([`event_delay_s`] after the
    /// next batch reveals it, the replica holding later batches until then) or left for the
    /// mirror to carry. Default true.
    ///
    /// [`event_delay_s`]: Self::event_delay_s
    pub event_replay: bool,
    /// Router replicas' sync ([`Router::drain_replica_sync`](crate::Router::drain_replica_sync)):
    /// the seconds from a replica's route, first token or completion to its record reaching
    /// the other replicas, each frame lost on the way with the probability
    /// [`event_loss`](Self::event_loss); `None`: off. The routers must be built with
    /// replica sync ([`PolicyRouter::with_replica_sync`](crate::PolicyRouter::with_replica_sync)),
    /// each with its own replica id; only the batched engine runs it. Default `None`.
    pub replica_sync: Option<f64>,
    /// Seed of the simulator's own randomness (a random front, event loss, priorities).
    /// Default 0.
    pub seed: u64,
    /// Whether requests ask for admission: each carries goodput's targets, [`ttft_target_s`]
    /// ([`RouteRequest::with_ttft_target`](crate::RouteRequest::with_ttft_target)) and
    /// [`tpot_target_s`] ([`RouteRequest::with_tpot_target`](crate::RouteRequest::with_tpot_target)),
    /// and a priority drawn from [`priorities`]; a request the router refuses
    /// ([`Error::Shed`]) is not run. Default false.
    ///
    /// [`ttft_target_s`]: Self::ttft_target_s
    /// [`tpot_target_s`]: Self::tpot_target_s
    /// [`priorities`]: Self::priorities
    pub admission: bool,
    /// The share of requests of each priority under [`admission`](Self::admission).
    /// Default: every request [`Priority::Standard`].
    pub priorities: PriorityMix,
    /// What a priority is drawn for: each session (its requests share it) or each request.
    /// Default [`PriorityScope::Session`].
    pub priority_scope: PriorityScope,
    /// Every how many output tokens after the first the host reports a running request's
    /// progress ([`Router::tokens_after`](crate::Router::tokens_after), cumulative), as a
    /// gateway reading the stream would; its last token is always reported. 0: only the
    /// last. Default 16. The batched engine only.
    pub progress_every: u32,
    /// Seconds of the same workload at 1× the host runs before the measured load (its
    /// requests arriving in the first `warmup_s` of the trace, their prompts made distinct):
    /// the router starts the measured part with what it learned, and the report's requests,
    /// latencies, goodput, sheds and hit ratio count only the measured part (the per-worker
    /// totals, prefill tokens and utilisation, count the warm-up too). The warm-up ends
    /// when the measured part starts: a closed-loop step of the warm-up that would arrive
    /// then or later (its answers at 1× took longer than the trace's timing) is not issued,
    /// nor the steps that wait for it, so that the measured part carries its own load
    /// alone. Default 0 (cold).
    pub warmup_s: f64,
    /// Bytes of KV one prompt token takes, for the KV a disaggregated run moves from a
    /// prefill worker to a decode worker
    /// ([`Simulation::run_pd`](super::Simulation::run_pd)): 2 × layers × KV heads × head
    /// size × bytes per value. Default 131,072 (Llama-3-8B in BF16).
    pub kv_bytes_per_token: u64,
    /// Bytes per second at which that KV moves, one transfer not slowing another. Default
    /// 50e9 (a 400 Gb/s RDMA link).
    pub kv_transfer_bytes_per_s: f64,
}

/// What a request's priority under admission is drawn for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PriorityScope {
    /// Each session draws one, which its requests share, as a gateway gives a client's or
    /// an objective's requests one criticality (llm-d's `InferenceObjective` priority,
    /// Dynamo's per-model busy thresholds); a request without a session draws its own, and
    /// a sub-agent is a session of its own. Refusing some steps of a session and serving
    /// others leaves the served ones to recompute the context the refused ones would have
    /// cached.
    #[default]
    Session,
    /// Each request draws its own, whatever its session.
    Request,
}

/// The share of requests of each priority, drawn per session or request from the
/// simulator's seed ([`ClusterConfig::priority_scope`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityMix {
    /// The shares of [`Priority::ALL`]'s priorities (sheddable, standard, critical), summing
    /// to 1.
    pub shares: [f64; 3],
}

impl Default for PriorityMix {
    fn default() -> Self {
        Self {
            shares: [0.0, 1.0, 0.0],
        }
    }
}

impl PriorityMix {
    /// Parses `critical:0.1,standard:0.6,sheddable:0.3` (any order; a priority not named has
    /// no requests).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for an unknown priority, a share that is not a number
    /// between 0 and 1, a priority named twice, or shares that do not sum to 1.
    pub fn parse(spec: &str) -> Result<Self, Error> {
        let mut shares = [0.0; 3];
        let mut named = [false; 3];
        for part in spec.split(',') {
            let bad =
                || crate::config::invalid("priorities", part, "NAME:SHARE, e.g. standard:0.6");
            let (name, share) = part.split_once(':').ok_or_else(bad)?;
            let priority = Priority::parse(name.trim())?;
            let k = Priority::ALL
                .iter()
                .position(|p| *p == priority)
                .unwrap_or(1);
            let share: f64 = share.trim().parse().map_err(|_| bad())?;
            if !(0.0..=1.0).contains(&share) || std::mem::replace(&mut named[k], true) {
                return Err(bad());
            }
            shares[k] = share;
        }
        let mix = Self { shares };
        mix.validate()?;
        Ok(mix)
    }

    /// Checks that the shares are between 0 and 1 and sum to 1.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] otherwise.
    pub fn validate(&self) -> Result<(), Error> {
        let sum: f64 = self.shares.iter().sum();
        if self.shares.iter().any(|s| !(0.0..=1.0).contains(s)) || (sum - 1.0).abs() > 1e-6 {
            return Err(crate::config::invalid(
                "priorities",
                format!("{:?}", self.shares),
                "shares between 0 and 1 that sum to 1",
            ));
        }
        Ok(())
    }

    /// The priority of a request whose uniform draw is `u` in `[0, 1)`.
    #[must_use]
    pub fn pick(&self, u: f64) -> Priority {
        let mut acc = 0.0;
        for (p, share) in Priority::ALL.into_iter().zip(self.shares) {
            acc += share;
            if u < acc {
                return p;
            }
        }
        Priority::Standard
    }
}

impl ClusterConfig {
    crate::config::setters! {
        /// Sets [`workers`](Self::workers).
        with_workers: workers: u32;
        /// Sets [`capacity_tokens`](Self::capacity_tokens).
        with_capacity_tokens: capacity_tokens: usize;
        /// Sets [`block_size`](Self::block_size).
        with_block_size: block_size: usize;
        /// Sets [`prefill_tokens_per_s`](Self::prefill_tokens_per_s).
        with_prefill_tokens_per_s: prefill_tokens_per_s: f64;
        /// Sets [`decode_s_per_token`](Self::decode_s_per_token).
        with_decode_s_per_token: decode_s_per_token: f64;
        /// Sets [`engine`](Self::engine).
        with_engine: engine: Engine;
        /// Sets [`batch`](Self::batch).
        with_batch: batch: BatchConfig;
        /// Sets [`ttft_target_s`](Self::ttft_target_s).
        with_ttft_target_s: ttft_target_s: f64;
        /// Sets [`tpot_target_s`](Self::tpot_target_s).
        with_tpot_target_s: tpot_target_s: f64;
        /// Sets [`admission`](Self::admission).
        with_admission: admission: bool;
        /// Sets [`priorities`](Self::priorities).
        with_priorities: priorities: PriorityMix;
        /// Sets [`priority_scope`](Self::priority_scope).
        with_priority_scope: priority_scope: PriorityScope;
        /// Sets [`speedup`](Self::speedup).
        with_speedup: speedup: f64;
        /// Sets [`sync`](Self::sync).
        with_sync: sync: SyncMode;
        /// Sets [`measure_decision_time`](Self::measure_decision_time).
        with_measure_decision_time: measure_decision_time: bool;
        /// Sets [`front`](Self::front).
        with_front: front: Front;
        /// Sets [`arrivals`](Self::arrivals).
        with_arrivals: arrivals: Arrivals;
        /// Sets [`scrape_interval_s`](Self::scrape_interval_s).
        with_scrape_interval_s: scrape_interval_s: f64;
        /// Sets [`event_delay_s`](Self::event_delay_s).
        with_event_delay_s: event_delay_s: f64;
        /// Sets [`event_loss`](Self::event_loss).
        with_event_loss: event_loss: f64;
        /// Sets [`event_replay`](Self::event_replay).
        with_event_replay: event_replay: bool;
        /// Sets [`replica_sync`](Self::replica_sync).
        with_replica_sync: replica_sync: Option<f64>;
        /// Sets [`seed`](Self::seed).
        with_seed: seed: u64;
        /// Sets [`kv_bytes_per_token`](Self::kv_bytes_per_token).
        with_kv_bytes_per_token: kv_bytes_per_token: u64;
        /// Sets [`kv_transfer_bytes_per_s`](Self::kv_transfer_bytes_per_s).
        with_kv_transfer_bytes_per_s: kv_transfer_bytes_per_s: f64;
        /// Sets [`progress_every`](Self::progress_every).
        with_progress_every: progress_every: u32;
        /// Sets [`warmup_s`](Self::warmup_s).
        with_warmup_s: warmup_s: f64;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a fleet of 0 or more than 4,096 workers, a capacity of
    /// less than one block, a non-positive or NaN rate, speedup or KV transfer bandwidth, or
    /// 0 bytes of KV per token; [`Error::InvalidBlockSize`] for a bad block size.
    pub fn validate(&self) -> Result<(), Error> {
        self.validate_figures()?;
        self.validate_engine()?;
        self.priorities.validate()?;
        self.batch.validate()
    }

    /// The fleet's sizes, rates, targets and delays, each within its range.
    fn validate_figures(&self) -> Result<(), Error> {
        int(
            "workers",
            self.workers,
            1..=RadixTree::MAX_WORKERS,
            "between 1 and 4096",
        )?;
        PrefixHasher::check_block_size(self.block_size)?;
        int(
            "capacity_tokens",
            self.capacity_tokens,
            self.block_size..,
            "at least one block",
        )?;
        int(
            "kv_bytes_per_token",
            self.kv_bytes_per_token,
            1..,
            "at least 1 byte",
        )?;
        for (field, value) in [
            ("prefill_tokens_per_s", self.prefill_tokens_per_s),
            ("kv_transfer_bytes_per_s", self.kv_transfer_bytes_per_s),
            ("speedup", self.speedup),
        ] {
            float(
                field,
                value,
                f64::MIN_POSITIVE..=f64::MAX,
                "a positive number",
            )?;
        }
        for (field, value) in [
            ("decode_s_per_token", self.decode_s_per_token),
            ("ttft_target_s", self.ttft_target_s),
            ("tpot_target_s", self.tpot_target_s),
            ("scrape_interval_s", self.scrape_interval_s),
            ("event_delay_s", self.event_delay_s),
            ("warmup_s", self.warmup_s),
        ] {
            float(field, value, 0.0..=f64::MAX, "zero or more seconds")?;
        }
        float(
            "event_loss",
            self.event_loss,
            0.0..=1.0,
            "a probability between 0 and 1",
        )?;
        if let Some(delay) = self.replica_sync {
            float(
                "replica_sync",
                delay,
                0.0..=f64::MAX,
                "zero or more seconds",
            )?;
        }
        Ok(())
    }

    /// What needs the batched engine (event sync, replica sync, engine profiles, a host
    /// tier of whole chunks) asks of the engine and its settings.
    fn validate_engine(&self) -> Result<(), Error> {
        if let Some(delay) = self.replica_sync {
            if self.engine == Engine::Simple {
                return Err(crate::config::invalid(
                    "replica_sync",
                    delay,
                    "replica sync needs the batched engine",
                ));
            }
        }
        if self.sync == SyncMode::Events && self.engine == Engine::Simple {
            return Err(crate::config::invalid(
                "sync",
                "events",
                "event sync needs the batched engine, whose workers keep a block pool",
            ));
        }
        if self.engine == Engine::Simple
            && (self.batch.profile.is_some() || self.batch.step_jitter > 0.0)
        {
            return Err(crate::config::invalid(
                "engine_profile",
                "a profile or step jitter",
                "the batched engine, whose workers run steps",
            ));
        }
        let chunk_tokens = self.batch.host_chunk_blocks.saturating_mul(self.block_size);
        if self.batch.host_capacity_tokens != 0 && self.batch.host_capacity_tokens < chunk_tokens {
            return Err(crate::config::invalid(
                "host_capacity_tokens",
                self.batch.host_capacity_tokens,
                "0 (no host tier) or at least one chunk of blocks",
            ));
        }
        Ok(())
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            capacity_tokens: 1_000_000,
            block_size: 16,
            prefill_tokens_per_s: 33_000.0,
            decode_s_per_token: 0.02,
            engine: Engine::Simple,
            batch: BatchConfig::default(),
            ttft_target_s: 2.0,
            tpot_target_s: 0.1,
            speedup: 1.0,
            sync: SyncMode::None,
            measure_decision_time: true,
            front: Front::RoundRobin,
            arrivals: Arrivals::Recorded,
            scrape_interval_s: 1.0,
            event_delay_s: 0.0,
            event_loss: 0.0,
            event_replay: true,
            replica_sync: None,
            seed: 0,
            admission: false,
            priorities: PriorityMix::default(),
            priority_scope: PriorityScope::Session,
            kv_bytes_per_token: 131_072,
            kv_transfer_bytes_per_s: 50e9,
            progress_every: 16,
            warmup_s: 0.0,
        }
    }
}
