"""Every Redis key and stream name Pincer uses; nobody formats a key elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "pincer:"
HANDS_GROUP = "hands"
BRAIN_GROUP = "brain"


@dataclass(frozen=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    @property
    def schema(self) -> str:
        """The layout version of everything stored under the prefix, and its migration lock (bus.schema)."""
        return f"{self.prefix}schema"

    @property
    def hands_requests(self) -> str:
        return f"{self.prefix}hands:requests"

    def hands_worker(self, worker_id: str) -> str:
        return f"{self.prefix}hands:worker:{worker_id}"

    @property
    def hands_workers_gone(self) -> str:
        """Set of the workers whose stream a retention pass found with no one reading it: the next pass
        deletes those it finds so again (memory/retention.py)."""
        return f"{self.prefix}hands:workers-gone"

    def hands_lane(self, lane: str) -> str:
        """A lane of the pool's backlog (``category:code``, ``tool:<name>``): its stream of calls ready to
        start. Its queues per session and counters share its hash tag (``hands/backlog.py``)."""
        return f"{self.hands_lane_prefix}{{{lane}}}"

    @property
    def hands_lane_prefix(self) -> str:
        return f"{self.prefix}hands:lane:"

    @property
    def hands_lanes(self) -> str:
        """Set of the lanes any worker has read: what `pincer status` and the sweeper look at."""
        return f"{self.prefix}hands:lanes"

    @property
    def backlog_turn(self) -> str:
        """Whichever worker sets this (NX, one interval) answers the backlog's expired calls for the pool."""
        return f"{self.prefix}hands:backlog-turn"

    @property
    def hands_control(self) -> str:
        """Broadcast to every Hands worker (each reads it all, no group): tool:cancel."""
        return f"{self.prefix}hands:control"

    @property
    def brain_control(self) -> str:
        """Broadcast to every Brain: chat:cancel."""
        return f"{self.prefix}brain:control"

    @property
    def brain_inbox(self) -> str:
        return f"{self.prefix}brain:inbox"

    def reply(self, instance_id: str) -> str:
        return f"{self.prefix}reply:{instance_id}"

    @property
    def dead(self) -> str:
        return f"{self.prefix}dead"

    @property
    def tools_digest(self) -> str:
        """Digest of the tool list Hands last announced; Brains refresh their cache when it moves."""
        return f"{self.prefix}hands:tools-digest"

    def alive(self, role: str) -> str:
        """Sorted set of live instances of a role, scored by when their heartbeat expires."""
        return f"{self.prefix}alive:{role}"

    def instance(self, role: str, instance_id: str) -> str:
        """Hash an instance keeps fresh with its heartbeat: host, pid, version, load (expires with it)."""
        return f"{self.prefix}instance:{role}:{instance_id}"

    def reaper_turn(self, stream: str, group: str) -> str:
        """Whichever consumer sets this (NX, one interval) runs the pool's reaper pass for the stream."""
        return f"{self.prefix}reaper:{{{stream}}}:{group}"

    def pool_limit(self, gate: str) -> str:
        """Sorted set of the holders of a pool-wide limit's slots (one hash tag: one cluster slot)."""
        return f"{self.prefix}{{limits}}:{gate}"

    def transcript(self, session_id: str) -> str:
        return f"{self.prefix}session:{{{session_id}}}:transcript"

    def session_record(self, session_id: str) -> str:
        """The session's flight record (a stream): each model request and response, tool call, stop."""
        return f"{self.prefix}session:{{{session_id}}}:record"

    def session_record_parts(self, session_id: str) -> str:
        """Hash of what the record's requests are made of (messages, tool lists), each stored once by digest."""
        return f"{self.prefix}session:{{{session_id}}}:record-parts"

    def session_about(self, session_id: str) -> str:
        """What a session is, for people: its title (from its first message, or as renamed) and its spend."""
        return f"{self.prefix}session:{{{session_id}}}:about"

    def session_seq(self, session_id: str) -> str:
        """Counter numbering a session's messages as the Gateway takes them."""
        return f"{self.prefix}session:{{{session_id}}}:seq"

    def session_done(self, session_id: str) -> str:
        """The ``seq`` of the session's last finished message."""
        return f"{self.prefix}session:{{{session_id}}}:done"

    def session_lease(self, session_id: str) -> str:
        """Which Brain runs the session's turn now (expires unless renewed)."""
        return f"{self.prefix}session:{{{session_id}}}:lease"

    def call_record(self, call_id: str) -> str:
        """A call to a tool that is not idempotent: who runs it, then its result (a redelivery reads it)."""
        return f"{self.prefix}call:{call_id}"

    def memory(self, agent_id: str, owner: str = "") -> str:
        """Hash of long-term notes, by key: an identity's own with this agent, or (owner "") the agent's
        shared ones. Agent ids never hold "/", so the two never meet."""
        return f"{self.prefix}memory:{agent_id}/{owner}" if owner else f"{self.prefix}memory:{agent_id}"

    @property
    def memory_log(self) -> str:
        """Stream of what memory search finds (notes written or deleted, words said in sessions), in order:
        each Hands worker indexes it (memory/recall.py)."""
        return f"{self.prefix}memory:log"

    @property
    def memory_log_notes(self) -> str:
        """Hash of each note's live entry in ``memory_log`` (its ref -> entry id): a new version or a delete
        removes the old one from the log. Its hash tag is the log's own name, so it shares the log's slot."""
        return f"{self.prefix}{{{self.memory_log}}}:notes"

    def memory_log_session(self, session_id: str) -> str:
        """List of the ``memory_log`` entries of a session's words: deleting the session removes them from the
        log (the log's slot, as ``memory_log_notes``)."""
        return f"{self.prefix}{{{self.memory_log}}}:session:{session_id}"

    def hands_process(self, process_id: str) -> str:
        """Hash describing a background process: owner worker, status, exit code, output tail."""
        return f"{self.prefix}hands:process:{process_id}"

    def session_events(self, session_id: str) -> str:
        """A session's live events (a capped stream): what any Gateway serves over SSE and WebSocket."""
        return f"{self.prefix}session:{{{session_id}}}:events"

    def gateway_wake(self, instance_id: str) -> str:
        """A Gateway's own stream: one entry wakes its event reader to follow one more session."""
        return f"{self.prefix}gateway:{instance_id}:wake"

    def session_events_seq(self, session_id: str) -> str:
        """The number of the session's last event: event ids are ``<n>-0``, so a gap shows in the ids."""
        return f"{self.prefix}session:{{{session_id}}}:events-seq"

    def mcp_owner(self, server: str) -> str:
        """Which Hands worker runs a ``stateful`` MCP server now (a lease it renews)."""
        return f"{self.prefix}mcp:{server}:owner"

    def mcp_tools(self, server: str) -> str:
        """The tools an MCP server listed last (JSON), for workers that do not run it (stateful, lazy)."""
        return f"{self.prefix}mcp:{server}:tools"

    def session_processes(self, session_id: str) -> str:
        """Set of the ids of a session's background processes (``hands_process``)."""
        return f"{self.prefix}session:{{{session_id}}}:processes"

    def approval(self, approval_id: str) -> str:
        """Hash of a pending approval: where to send the decision, what it is for, when it expires."""
        return f"{self.prefix}approval:{approval_id}"

    def question(self, question_id: str) -> str:
        """Hash of a pending ``ask_user`` question (``bus.records.PendingQuestion``): where the answers go,
        whose session it is, what was asked, and the answers given so far."""
        return f"{self.prefix}question:{question_id}"

    def channel_awaiting(self, channel: str, user: str, chat: str) -> str:
        """The question (its id) whose free-text answer is a person's next message in one chat of a channel."""
        return f"{self.prefix}channel:{channel}:awaiting:{user}:{chat}"

    def exec_allowlist(self, agent_id: str, identity: str) -> str:
        """Hash of the always-rules that cover one identity on one agent, on top of hands.exec.allowlist:
        entry (JSON) -> who allowed it and when (JSON)."""
        return f"{self.prefix}exec-allowlist:{agent_id}:{identity}"

    @property
    def sessions(self) -> str:
        """Sorted set of session ids, scored by last activity."""
        return f"{self.prefix}sessions"

    def sessions_of(self, owner: str) -> str:
        """Sorted set of one owner's session ids (``owner/...``), scored by last activity: a list that
        reads only theirs (memory/session_index.py)."""
        return f"{self.prefix}sessions:of:{owner}"

    @property
    def sessions_indexed(self) -> str:
        """When the owners' lists last caught up with the pool's (seconds since the epoch)."""
        return f"{self.prefix}sessions:indexed"

    def session_owner(self, session_id: str) -> str:
        """Name of the Gateway token that started the session (only it, or an operator, may use it)."""
        return f"{self.prefix}session:{{{session_id}}}:owner"

    @property
    def tokens(self) -> str:
        """Hash of Gateway tokens: SHA-256 of the token -> its record (name, scope, agents); never the token."""
        return f"{self.prefix}{{tokens}}:by-digest"

    @property
    def token_names(self) -> str:
        """Hash of token name -> its digest: names are unique (same hash tag as ``tokens``)."""
        return f"{self.prefix}{{tokens}}:by-name"

    def login_code(self, code_digest: str) -> str:
        """A one-time sign-in link's code (hashed): which token it stands for, for a minute or two."""
        return f"{self.prefix}{{tokens}}:login:{code_digest}"

    def web_session(self, session_digest: str) -> str:
        """A browser's sign-in (its cookie, hashed): the identity and the token it came from."""
        return f"{self.prefix}{{tokens}}:web:{session_digest}"

    def sign_ins_of(self, token_digest: str) -> str:
        """Sorted set of one token's live sign-in codes and browser sessions (their keys, by when each
        lapses): how many each token keeps is bounded, and revoking the token ends them all."""
        return f"{self.prefix}{{tokens}}:sign-ins:{token_digest}"

    def message_rate(self, token_name: str) -> str:
        """A token's message bucket (messages left, last refill), shared by every Gateway of the pool and the
        scheduler."""
        return f"{self.prefix}rate:{token_name}"

    def text_rate(self, token_name: str) -> str:
        """A token's bucket of bytes of text it may have the pool keep (bytes left, last refill): its day's."""
        return f"{self.prefix}text-rate:{token_name}"

    @property
    def hooks(self) -> str:
        """Hash of signed webhooks: name -> its record (agent, template, delivery URL, secret)."""
        return f"{self.prefix}hooks"

    def hook_seen(self, name: str, signature_digest: str) -> str:
        """A signed request already received (kept for the replay window)."""
        return f"{self.prefix}hook-seen:{name}:{signature_digest}"

    # --- chat channels (gateway/channels): ``channel`` is e.g. "telegram", ``bot`` the bot's own id ---

    def channel_inbox(self, channel: str, bot: str) -> str:
        """A bot's platform events, written as they are taken from the platform (with its offset)."""
        return f"{self.prefix}channel:{channel}:{bot}:in"

    def channel_offset(self, channel: str, bot: str) -> str:
        """The platform's position up to which the inbox holds everything (Telegram's update offset)."""
        return f"{self.prefix}channel:{channel}:{bot}:offset"

    def channel_poller(self, channel: str, bot: str) -> str:
        """The lease of the one replica that polls the platform for this bot (a value per holder)."""
        return f"{self.prefix}channel:{channel}:{bot}:poller"

    def channel_state(self, channel: str, bot: str) -> str:
        """A hash of the bot's progress: last successful poll, messages in and out, errors."""
        return f"{self.prefix}channel:{channel}:{bot}:state"

    def channel_delivery(self, channel: str, event_id: str) -> str:
        """What an incoming event led to: its turn's message id, the platform message showing the answer, done."""
        return f"{self.prefix}channel:{channel}:delivery:{event_id}"

    def channel_paired(self, channel: str) -> str:
        """Hash of the platform users let in by `pincer channels pair` (user id -> who let them in, when)."""
        return f"{self.prefix}channel:{channel}:paired"

    def channel_handles(self, channel: str) -> str:
        """Hash of allow_from's ``@handle`` entries, each bound to the platform user id first seen with that
        handle (handle -> user id): that id is let in whatever it is named later, and nobody else by the handle."""
        return f"{self.prefix}channel:{channel}:handles"

    def channel_pairing(self, channel: str, code: str) -> str:
        """A stranger's pending one-time pairing code (expires)."""
        return f"{self.prefix}channel:{channel}:pairing:{code}"

    def channel_stranger(self, channel: str, user: str) -> str:
        """The code a stranger was given, so they are told it once, not on every message."""
        return f"{self.prefix}channel:{channel}:stranger:{user}"

    def channel_generation(self, channel: str, user: str, chat: str) -> str:
        """How many times /new was said in a chat by a user: the session's name carries it."""
        return f"{self.prefix}channel:{channel}:generation:{user}:{chat}"

    def upload_quota(self, identity: str, day: int) -> str:
        """Files an identity has sent the agent on day ``day`` (days since the epoch, UTC), over every channel:
        counted and capped in one step before any is fetched (``channels.<name>.max_files_per_day``)."""
        return f"{self.prefix}uploads:{{{identity}}}:{day}"

    def channel_thread(self, channel: str, chat: str) -> str:
        """Where a conversation's answers go, for a platform whose chat id does not say (an email thread)."""
        return f"{self.prefix}channel:{channel}:thread:{chat}"

    def channel_asked(self, channel: str, message: str) -> str:
        """The choices of a question sent as a message that can only be answered by a reply (email)."""
        return f"{self.prefix}channel:{channel}:asked:{message}"

    def channel_outbox(self, channel: str) -> str:
        """Stream of what the agent says on its own initiative in a channel's chats (``channel:send``)."""
        return f"{self.prefix}channel:{channel}:outbox"

    def spend(self, period: str, scope: str) -> str:
        """Hash of what one budget scope (pool, agent:X, identity:Y) spent in a period (day:..., month:...)."""
        return f"{self.prefix}spend:{period}:{scope}"

    @property
    def spend_holds(self) -> str:
        """Sorted set of the cost bounds reserved for calls in flight, scored by when each lapses."""
        return f"{self.prefix}spend:holds"

    def spend_hold(self, hold_id: str) -> str:
        """Hash of one reservation: its bound and the budgets it holds it in."""
        return f"{self.prefix}spend:hold:{hold_id}"

    @property
    def alerts(self) -> str:
        """Stream of what the owner is told (a budget's share reached)."""
        return f"{self.prefix}alerts"

    @property
    def jobs(self) -> str:
        """Hash of every scheduled job, by id (<owner>/<name>), as JSON."""
        return f"{self.prefix}jobs"

    @property
    def jobs_due(self) -> str:
        """Sorted set of job ids, scored by their next due instant (Unix seconds)."""
        return f"{self.prefix}jobs:due"

    def job_runs(self, job_id: str) -> str:
        """Hash of a job's records, one per due instant (its milliseconds, zero-padded)."""
        return f"{self.prefix}jobs:runs:{job_id}"

    def job_turn(self, message_id: str) -> str:
        """Which job and due instant a turn was started for (until its outcome is recorded)."""
        return f"{self.prefix}jobs:turn:{message_id}"

    @property
    def jobs_results(self) -> str:
        """Stream the turns that jobs start answer on (read by the schedulers, a group)."""
        return f"{self.prefix}jobs:results"

    def delegation_tree(self, root_message_id: str) -> str:
        """Hash of what each turn of a delegation tree has used (by message id), against the root's limits."""
        return f"{self.prefix}delegation:tree:{root_message_id}"

    def delegation_cancelled(self, message_id: str) -> str:
        """Set when a sub-agent's turn is cancelled, so one that has not started yet ends as it starts."""
        return f"{self.prefix}delegation:cancelled:{message_id}"

    def identity_seen(self, identity: str) -> str:
        """When an identity last started a turn itself (not a job's): heartbeats skip an idle owner."""
        return f"{self.prefix}seen:{identity}"

    @property
    def scheduler_lease(self) -> str:
        return f"{self.prefix}jobs:scheduler"

    @property
    def scheduler_tick(self) -> str:
        """When the scheduler holding the lease last looked at the due set (its liveness)."""
        return f"{self.prefix}jobs:tick"

    @property
    def retention_lease(self) -> str:
        """Held by the one Gateway that archives idle sessions and trims old dead letters and alerts."""
        return f"{self.prefix}retention:lease"
