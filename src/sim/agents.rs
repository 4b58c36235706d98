//! [`Workload::AgentLoop`](super::Workload::AgentLoop): agent sessions whose steps wait for
//! their answers, fanning out to parallel sub-agents.
//!
//! Every request but a session's first carries [`Follows`]: the requests whose last tokens
//! it waits for and the tool's time after them. Its `arrival_s` is where it would arrive
//! if every answer were instant (a predecessor's plus the gap): it orders the list (so a
//! request comes after those it follows) and the references' replay, not the simulation.

use super::request::{Follows, Request, prefixed, tokens};
use super::rng::Rng;
use crate::hash::TokenId;

/// The shape of [`Workload::AgentLoop`](super::Workload::AgentLoop)'s sessions.
pub(super) struct AgentLoop {
    pub(super) sessions: usize,
    pub(super) steps: usize,
    pub(super) agents: usize,
    pub(super) system_tokens: usize,
    pub(super) task_tokens: usize,
    pub(super) tool_tokens: usize,
    pub(super) action_tokens: u32,
    pub(super) tool_time_s: f64,
    pub(super) rate_per_s: f64,
    pub(super) fan_out_every: usize,
    pub(super) subagents: usize,
    pub(super) subagent_steps: usize,
}

/// The requests pushed so far, each a new one's index.
struct Out<'a>(&'a mut Vec<Request>);

impl Out<'_> {
    /// Pushes `request` and returns its index.
    fn push(&mut self, request: Request) -> usize {
        self.0.push(request);
        self.0.len() - 1
    }

    /// When request `i` would arrive with instant answers.
    fn nominal(&self, i: usize) -> f64 {
        self.0[i].arrival_s
    }
}

impl AgentLoop {
    /// Pushes every session's requests, named `g{tag}-s{session}`; sub-agents append
    /// `/{step}.{k}`.
    pub(super) fn generate(&self, rng: &mut Rng, tag: u64, out: &mut Vec<Request>) {
        let systems: Vec<_> = (0..self.agents.max(1))
            .map(|_| tokens(rng, self.system_tokens))
            .collect();
        let mut out = Out(out);
        let mut start = 0.0;
        for s in 0..self.sessions {
            start += rng.exponential(self.rate_per_s);
            let system = &systems[rng.below(systems.len() as u64) as usize];
            let prompt = prefixed(rng, system, self.task_tokens);
            self.session(rng, &mut out, prompt, start, &format!("g{tag}-s{s}"));
        }
    }

    /// One session's steps from its first `prompt` at `start`.
    fn session(
        &self,
        rng: &mut Rng,
        out: &mut Out<'_>,
        mut prompt: Vec<TokenId>,
        start: f64,
        name: &str,
    ) {
        let first = Request::new(start, prompt.clone(), self.action_tokens).with_session(name);
        let mut last = out.push(first);
        for step in 1..self.steps.max(1) {
            prompt.extend(tokens(rng, self.action_tokens as usize));
            let fan_out = self.fan_out_every > 0 && step % self.fan_out_every == 0;
            let waits = if fan_out && self.subagents > 0 {
                let name = format!("{name}/{step}");
                self.fan_out(rng, out, &mut prompt, last, &name)
            } else {
                prompt.extend(tokens(rng, self.tool_tokens));
                vec![last]
            };
            last = self.follow(rng, out, waits, prompt.clone(), name);
        }
    }

    /// The sub-agents the action ending `prompt` starts after request `parent`: their
    /// results join `prompt`; returns their last requests.
    fn fan_out(
        &self,
        rng: &mut Rng,
        out: &mut Out<'_>,
        prompt: &mut Vec<TokenId>,
        parent: usize,
        name: &str,
    ) -> Vec<usize> {
        let mut lasts = Vec::with_capacity(self.subagents);
        for k in 0..self.subagents {
            let mut context = prefixed(rng, prompt, self.task_tokens);
            let name = format!("{name}.{k}");
            let mut last = self.follow(rng, out, vec![parent], context.clone(), &name);
            for _ in 1..self.subagent_steps.max(1) {
                context.extend(tokens(rng, self.action_tokens as usize));
                context.extend(tokens(rng, self.tool_tokens));
                last = self.follow(rng, out, vec![last], context.clone(), &name);
            }
            lasts.push(last);
        }
        for _ in &lasts {
            prompt.extend(tokens(rng, self.action_tokens as usize));
        }
        lasts
    }

    /// Pushes a request of `prompt` in session `name` arriving a tool's time after the
    /// requests `waits` end; returns its index.
    fn follow(
        &self,
        rng: &mut Rng,
        out: &mut Out<'_>,
        waits: Vec<usize>,
        prompt: Vec<TokenId>,
        name: &str,
    ) -> usize {
        let gap = self.tool_time_s * 0.5 + rng.exponential(2.0 / self.tool_time_s.max(1e-9));
        let after = waits.iter().map(|&w| out.nominal(w)).fold(0.0, f64::max);
        let request = Request::new(after + gap, prompt, self.action_tokens)
            .with_session(name)
            .with_follows(Follows::new(waits, gap));
        out.push(request)
    }
}
