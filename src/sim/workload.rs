//! Seeded synthetic workloads.

use super::agents::AgentLoop;
#[cfg(doc)]
use super::request::Follows;
use super::request::{Prompt, Request, prefixed, tokens};
use super::rng::{Rng, Zipf};
use crate::hash::TokenId;

/// A seeded synthetic workload. Each variant documents its parameters;
/// [`generate`](Workload::generate) gives the same requests for the same seed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Workload {
    /// Requests that start with one of `systems` system prompts of `system_tokens` tokens,
    /// chosen with Zipf(`zipf_s`) popularity, followed by a unique question of
    /// `question_tokens` tokens.
    SharedPrompts {
        /// Requests.
        requests: usize,
        /// Distinct system prompts.
        systems: usize,
        /// Tokens per system prompt.
        system_tokens: usize,
        /// Tokens per question.
        question_tokens: usize,
        /// Zipf exponent of system-prompt popularity.
        zipf_s: f64,
        /// Mean arrivals per second (Poisson).
        rate_per_s: f64,
        /// Output tokens per request.
        output_tokens: u32,
    },
    /// Multi-turn conversations: each turn's prompt is the previous prompt, its answer and a
    /// new message; the next turn arrives `think_time_s` after the previous one (plus
    /// exponential jitter). Sessions start as a Poisson process.
    Conversations {
        /// Conversations.
        sessions: usize,
        /// Turns per conversation.
        turns: usize,
        /// Tokens of the first message (including any system prompt).
        first_tokens: usize,
        /// Tokens of each later user message.
        message_tokens: usize,
        /// Tokens of each answer (also the output length).
        answer_tokens: u32,
        /// Mean seconds between turns.
        think_time_s: f64,
        /// Mean new sessions per second.
        rate_per_s: f64,
    },
    /// Few-shot prompting: one of `templates` instruction templates (Zipf popularity) with
    /// `examples` worked examples of `example_tokens` each, then a query.
    FewShot {
        /// Requests.
        requests: usize,
        /// Distinct templates.
        templates: usize,
        /// Examples per template.
        examples: usize,
        /// Tokens per example.
        example_tokens: usize,
        /// Tokens per query.
        query_tokens: usize,
        /// Mean arrivals per second.
        rate_per_s: f64,
    },
    /// Long-document QA: many questions on a few long documents (uniform choice).
    DocumentQa {
        /// Questions.
        requests: usize,
        /// Distinct documents.
        documents: usize,
        /// Tokens per document.
        document_tokens: usize,
        /// Tokens per question.
        question_tokens: usize,
        /// Mean arrivals per second.
        rate_per_s: f64,
    },
    /// All of the above at once, arrivals interleaved.
    Mix(Vec<Workload>),
    /// Long-context requests over shared repositories (code assistants): each request
    /// reads the first part of one of `repositories` contexts of `repository_tokens`
    /// tokens (uniformly chosen, its length uniform in `min_tokens..=repository_tokens`, in
    /// whole content blocks of 512 tokens), then a question of its own of `question_tokens`
    /// tokens (under 512), and answers in `output_tokens`. Requests on one repository share
    /// the shorter one's context.
    LongContext {
        /// Requests.
        requests: usize,
        /// Distinct repository contexts.
        repositories: usize,
        /// Tokens of each repository's context: the longest prompt's context.
        repository_tokens: usize,
        /// Tokens of context the shortest prompt reads.
        min_tokens: usize,
        /// Tokens of each request's own question (under 512).
        question_tokens: usize,
        /// Output tokens per request.
        output_tokens: u32,
        /// Mean arrivals per second (Poisson).
        rate_per_s: f64,
    },
    /// Agent sessions: each runs one of `agents` agents (its system prompt with tool
    /// definitions, `system_tokens` tokens, shared by its sessions) on a task of
    /// `task_tokens` tokens, then `steps` steps: every step's prompt is the previous one plus
    /// the model's action (`action_tokens`, also the output length) and the tool's result
    /// (`tool_tokens`), arriving `step_time_s` after the previous step (plus exponential
    /// jitter). Sessions start as a Poisson process. Arrivals are open-loop: a step does not
    /// wait for the previous answer ([`Workload::AgentLoop`] is the closed-loop one).
    Agentic {
        /// Agent sessions.
        sessions: usize,
        /// Requests per session.
        steps: usize,
        /// Distinct agents (system prompts), chosen uniformly.
        agents: usize,
        /// Tokens of each agent's system prompt.
        system_tokens: usize,
        /// Tokens of each session's task.
        task_tokens: usize,
        /// Tokens of each tool result.
        tool_tokens: usize,
        /// Tokens of each action (the output of every step).
        action_tokens: u32,
        /// Mean seconds between a session's steps.
        step_time_s: f64,
        /// Mean new sessions per second.
        rate_per_s: f64,
    },
    /// Agent sessions that wait for their answers (closed loop): each runs one of `agents`
    /// agents (its system prompt, `system_tokens`, shared by its sessions) on a task of
    /// `task_tokens` tokens for `steps` steps. Every step's prompt is the previous one plus
    /// the model's action (`action_tokens`, also the output length) and the tool's result
    /// (`tool_tokens`), and it arrives the tool's time after the previous step's last token
    /// (`tool_time_s` on average: half of it fixed, the rest exponential). Every
    /// `fan_out_every`-th step (0: never) waits instead for `subagents` parallel sub-agents,
    /// started by the previous action: each a session of its own whose prompt is the
    /// parent's context plus a sub-task (`task_tokens`), running `subagent_steps` steps as
    /// the parent does; their results (an action's tokens each) join the parent's prompt.
    /// Sessions start as a Poisson process; [`Request::follows`] carries the waits.
    AgentLoop {
        /// Agent sessions.
        sessions: usize,
        /// Steps of each session (its sub-agents' aside).
        steps: usize,
        /// Distinct agents (system prompts), chosen uniformly.
        agents: usize,
        /// Tokens of each agent's system prompt.
        system_tokens: usize,
        /// Tokens of each session's task and of each sub-agent's sub-task.
        task_tokens: usize,
        /// Tokens of each tool result.
        tool_tokens: usize,
        /// Tokens of each action (the output of every step).
        action_tokens: u32,
        /// Mean seconds a tool runs between an answer and the next step.
        tool_time_s: f64,
        /// Mean new sessions per second.
        rate_per_s: f64,
        /// Every this many steps the session fans out to sub-agents (0: never).
        fan_out_every: usize,
        /// Sub-agents per fan-out.
        subagents: usize,
        /// Steps of each sub-agent.
        subagent_steps: usize,
    },
}

impl Workload {
    /// The built-in workloads the simulator runs with no flags: shared system prompts,
    /// conversations, few-shot templates, document QA, their mix, agent sessions, and
    /// long-context requests over shared repositories.
    #[must_use]
    pub fn builtin() -> Vec<(&'static str, Workload)> {
        let shared = Workload::SharedPrompts {
            requests: 2_000,
            systems: 50,
            system_tokens: 2_000,
            question_tokens: 200,
            zipf_s: 1.0,
            rate_per_s: 40.0,
            output_tokens: 100,
        };
        let conversations = Workload::Conversations {
            sessions: 300,
            turns: 6,
            first_tokens: 1_000,
            message_tokens: 150,
            answer_tokens: 250,
            think_time_s: 20.0,
            rate_per_s: 5.0,
        };
        let few_shot = Workload::FewShot {
            requests: 1_500,
            templates: 20,
            examples: 8,
            example_tokens: 300,
            query_tokens: 100,
            rate_per_s: 30.0,
        };
        let documents = Workload::DocumentQa {
            requests: 1_000,
            documents: 40,
            document_tokens: 8_000,
            question_tokens: 60,
            rate_per_s: 8.0,
        };
        let mix = Workload::Mix(vec![
            shared.clone(),
            conversations.clone(),
            few_shot.clone(),
            documents.clone(),
        ]);
        vec![
            ("shared_prompts", shared),
            ("conversations", conversations),
            ("few_shot", few_shot),
            ("document_qa", documents),
            ("mix", mix),
            ("agentic", Self::agent_loop()),
            ("agentic_swarm", Self::agent_swarm()),
            (
                "agentic_open",
                Workload::Agentic {
                    sessions: 150,
                    steps: 15,
                    agents: 4,
                    system_tokens: 6_000,
                    task_tokens: 300,
                    tool_tokens: 800,
                    action_tokens: 120,
                    step_time_s: 4.0,
                    rate_per_s: 1.0,
                },
            ),
            ("agentic_long", Self::agents_answering_at_length()),
            (
                "long_context",
                Workload::LongContext {
                    requests: 400,
                    repositories: 6,
                    repository_tokens: 131_072,
                    min_tokens: 16_384,
                    question_tokens: 300,
                    output_tokens: 96,
                    rate_per_s: 0.8,
                },
            ),
        ]
    }

    /// The built-in `agentic` workload: 100 closed-loop sessions of 15 steps over 4 agents'
    /// 6,000-token prompts, tools of 800 tokens and 2 s, two fan-outs of 2 sub-agents.
    fn agent_loop() -> Workload {
        Workload::AgentLoop {
            sessions: 100,
            steps: 15,
            agents: 4,
            system_tokens: 6_000,
            task_tokens: 300,
            tool_tokens: 800,
            action_tokens: 120,
            tool_time_s: 2.0,
            rate_per_s: 1.0,
            fan_out_every: 5,
            subagents: 2,
            subagent_steps: 3,
        }
    }

    /// The built-in `agentic_long` workload: open-loop agent sessions whose every step
    /// generates 2,000 tokens (a plan, a patch, a report), so that decoding fills the
    /// batches while prefill queues stay short: 120 sessions of 8 steps over 4 agents'
    /// 4,000-token prompts, tool results of 600 tokens, a step every 30 s on average.
    fn agents_answering_at_length() -> Workload {
        Workload::Agentic {
            sessions: 120,
            steps: 8,
            agents: 4,
            system_tokens: 4_000,
            task_tokens: 300,
            tool_tokens: 600,
            action_tokens: 2_000,
            step_time_s: 30.0,
            rate_per_s: 0.25,
        }
    }

    /// The built-in `agentic_swarm` workload: more agents, longer tool results and
    /// outputs, and wider fan-outs than `agentic`.
    fn agent_swarm() -> Workload {
        Workload::AgentLoop {
            sessions: 60,
            steps: 10,
            agents: 8,
            system_tokens: 4_000,
            task_tokens: 500,
            tool_tokens: 2_000,
            action_tokens: 400,
            tool_time_s: 3.0,
            rate_per_s: 0.5,
            fan_out_every: 3,
            subagents: 4,
            subagent_steps: 3,
        }
    }

    /// The requests of this workload for `seed`, ordered by arrival (a closed-loop
    /// request's [`follows`](Request::follows) indices point into this order).
    #[must_use]
    pub fn generate(&self, seed: u64) -> Vec<Request> {
        let mut out = Vec::new();
        self.generate_into(&mut Rng::new(seed), 0, &mut out);
        by_arrival(out)
    }

    fn generate_into(&self, rng: &mut Rng, tag: u64, out: &mut Vec<Request>) {
        match *self {
            Workload::SharedPrompts {
                requests,
                systems,
                system_tokens,
                question_tokens,
                zipf_s,
                rate_per_s,
                output_tokens,
            } => {
                let prompts: Vec<_> = (0..systems.max(1))
                    .map(|_| tokens(rng, system_tokens))
                    .collect();
                let zipf = Zipf::new(prompts.len(), zipf_s);
                let arrivals = Poisson {
                    rate_per_s,
                    requests,
                };
                arrivals.generate(rng, out, |rng| {
                    let p = &prompts[zipf.sample(rng)];
                    (prefixed(rng, p, question_tokens), output_tokens)
                });
            }
            Workload::Conversations { .. } => self.conversations(rng, tag, out),
            Workload::Agentic { .. } => self.agentic(rng, tag, out),
            Workload::AgentLoop { .. } => self.agents_waiting(rng, tag, out),
            Workload::FewShot {
                requests,
                templates,
                examples,
                example_tokens,
                query_tokens,
                rate_per_s,
            } => {
                let bank: Vec<_> = (0..templates.max(1))
                    .map(|_| tokens(rng, examples * example_tokens + 100))
                    .collect();
                let zipf = Zipf::new(bank.len(), 0.8);
                let arrivals = Poisson {
                    rate_per_s,
                    requests,
                };
                arrivals.generate(rng, out, |rng| {
                    let p = &bank[zipf.sample(rng)];
                    (prefixed(rng, p, query_tokens), 50)
                });
            }
            Workload::DocumentQa {
                requests,
                documents,
                document_tokens,
                question_tokens,
                rate_per_s,
            } => {
                let docs: Vec<_> = (0..documents.max(1))
                    .map(|_| tokens(rng, document_tokens))
                    .collect();
                let arrivals = Poisson {
                    rate_per_s,
                    requests,
                };
                arrivals.generate(rng, out, |rng| {
                    let p = &docs[rng.below(docs.len() as u64) as usize];
                    (prefixed(rng, p, question_tokens), 80)
                });
            }
            Workload::LongContext { .. } => self.long_context(rng, tag, out),
            Workload::Mix(ref parts) => {
                for (i, part) in parts.iter().enumerate() {
                    part.generate_into(rng, tag * 16 + i as u64 + 1, out);
                }
            }
        }
    }

    /// [`Workload::Conversations`]: each session's turns, the prompt growing by the answer
    /// and the next message.
    fn conversations(&self, rng: &mut Rng, tag: u64, out: &mut Vec<Request>) {
        let Workload::Conversations {
            sessions,
            turns,
            first_tokens,
            message_tokens,
            answer_tokens,
            think_time_s,
            rate_per_s,
        } = *self
        else {
            return;
        };
        let shape = Sessions {
            sessions,
            turns,
            growth: (answer_tokens as usize, message_tokens),
            output: answer_tokens,
            gap_s: think_time_s,
            rate_per_s,
            label: "w",
        };
        shape.generate(rng, tag, out, |rng| tokens(rng, first_tokens));
    }

    /// [`Workload::LongContext`]: prompts of content blocks, each repository's blocks
    /// shared, each question a block of its own.
    fn long_context(&self, rng: &mut Rng, tag: u64, out: &mut Vec<Request>) {
        const BLOCK: usize = 512;
        let Workload::LongContext {
            requests,
            repositories,
            repository_tokens,
            min_tokens,
            question_tokens,
            output_tokens,
            rate_per_s,
        } = *self
        else {
            return;
        };
        let most = repository_tokens.div_ceil(BLOCK).max(1);
        let least = (min_tokens / BLOCK).clamp(1, most);
        let question = question_tokens.min(BLOCK - 1);
        let mut at = 0.0;
        for _ in 0..requests {
            at += rng.exponential(rate_per_s);
            let repository = rng.below(repositories.max(1) as u64);
            let blocks = least + rng.below((most - least + 1) as u64) as usize;
            let base = (tag << 48) ^ (repository << 32);
            let mut ids: Vec<u64> = (0..blocks as u64).map(|b| base | b).collect();
            ids.push(rng.next_u64() | 1 << 63);
            let prompt = Prompt::Blocks {
                ids,
                tokens_per_id: BLOCK,
                len: blocks * BLOCK + question,
            };
            out.push(Request {
                arrival_s: at,
                prompt,
                output_tokens,
                session: None,
                follows: None,
            });
        }
    }

    /// [`Workload::AgentLoop`]: closed-loop sessions and their sub-agents.
    fn agents_waiting(&self, rng: &mut Rng, tag: u64, out: &mut Vec<Request>) {
        let Workload::AgentLoop {
            sessions,
            steps,
            agents,
            system_tokens,
            task_tokens,
            tool_tokens,
            action_tokens,
            tool_time_s,
            rate_per_s,
            fan_out_every,
            subagents,
            subagent_steps,
        } = *self
        else {
            return;
        };
        let shape = AgentLoop {
            sessions,
            steps,
            agents,
            system_tokens,
            task_tokens,
            tool_tokens,
            action_tokens,
            tool_time_s,
            rate_per_s,
            fan_out_every,
            subagents,
            subagent_steps,
        };
        shape.generate(rng, tag, out);
    }

    /// [`Workload::Agentic`]: each session's steps, the prompt growing by an action and a
    /// tool result.
    fn agentic(&self, rng: &mut Rng, tag: u64, out: &mut Vec<Request>) {
        let Workload::Agentic {
            sessions,
            steps,
            agents,
            system_tokens,
            task_tokens,
            tool_tokens,
            action_tokens,
            step_time_s,
            rate_per_s,
        } = *self
        else {
            return;
        };
        let systems: Vec<_> = (0..agents.max(1))
            .map(|_| tokens(rng, system_tokens))
            .collect();
        let shape = Sessions {
            sessions,
            turns: steps,
            growth: (action_tokens as usize, tool_tokens),
            output: action_tokens,
            gap_s: step_time_s,
            rate_per_s,
            label: "a",
        };
        shape.generate(rng, tag, out, |rng| {
            let system = &systems[rng.below(systems.len() as u64) as usize];
            prefixed(rng, system, task_tokens)
        });
    }
}

/// Sessions of requests whose prompts grow turn by turn.
struct Sessions {
    sessions: usize,
    /// Requests per session.
    turns: usize,
    /// Tokens each turn adds: the model's output, then the next input.
    growth: (usize, usize),
    /// Output tokens of every request.
    output: u32,
    /// Mean seconds between a session's requests.
    gap_s: f64,
    /// Mean new sessions per second.
    rate_per_s: f64,
    /// The sessions' name prefix.
    label: &'static str,
}

impl Sessions {
    /// Pushes every session's requests, its first prompt made by `first`.
    fn generate(
        &self,
        rng: &mut Rng,
        tag: u64,
        out: &mut Vec<Request>,
        mut first: impl FnMut(&mut Rng) -> Vec<TokenId>,
    ) {
        let mut start = 0.0;
        for s in 0..self.sessions {
            start += rng.exponential(self.rate_per_s);
            let mut t = start;
            let mut prompt = first(rng);
            for turn in 0..self.turns {
                if turn > 0 {
                    prompt.extend(tokens(rng, self.growth.0));
                    prompt.extend(tokens(rng, self.growth.1));
                    t += self.gap_s * 0.5 + rng.exponential(2.0 / self.gap_s.max(1e-9));
                }
                out.push(
                    Request::new(t, prompt.clone(), self.output)
                        .with_session(format!("{}{tag}-s{s}", self.label)),
                );
            }
        }
    }
}

/// `requests` sorted by arrival (ties in their order), [`Request::follows`] renumbered
/// to match.
fn by_arrival(requests: Vec<Request>) -> Vec<Request> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| requests[a].arrival_s.total_cmp(&requests[b].arrival_s));
    let mut place = vec![0; requests.len()];
    for (new, &old) in order.iter().enumerate() {
        place[old] = new;
    }
    let mut slots: Vec<Option<Request>> = requests.into_iter().map(Some).collect();
    order
        .iter()
        .filter_map(|&old| slots[old].take())
        .map(|mut r| {
            if let Some(f) = r.follows.as_mut() {
                f.requests.iter_mut().for_each(|i| *i = place[*i]);
            }
            r
        })
        .collect()
}

/// Independent requests arriving as a Poisson process.
struct Poisson {
    rate_per_s: f64,
    requests: usize,
}

impl Poisson {
    /// Pushes `requests` requests, each prompt and output length made by `make`.
    fn generate(
        &self,
        rng: &mut Rng,
        out: &mut Vec<Request>,
        mut make: impl FnMut(&mut Rng) -> (Vec<TokenId>, u32),
    ) {
        let mut t = 0.0;
        for _ in 0..self.requests {
            t += rng.exponential(self.rate_per_s);
            let (prompt, output) = make(rng);
            out.push(Request::new(t, prompt, output));
        }
    }
}
