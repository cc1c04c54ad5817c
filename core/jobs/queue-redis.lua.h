/* queue-redis.lua.h — the Lua scripts of the Redis queue (queue-redis.c).
 * Every script runs atomically in Redis; each state transition is one
 * script, so two gateways or workers can never both move the same job.
 *
 * Keys (P is the configured prefix, "spindle:" by default):
 *   P seq          INCR counter of job ids
 *   P job:<id>     HASH: the job (fields below)
 *   P ready        ZSET of queued ids ready to run, score -priority*2^32 + fo
 *                  (highest priority first, FIFO within one)
 *   P ready:<pl>   ZSET, the entries of P ready whose job is of pipeline pl
 *                  (same scores), for leases that name their pipelines
 *   P pls          SET of the pipelines that have had a P ready:<pl>
 *   P delayed      ZSET of queued ids backing off, score = not_before (ms)
 *   P deadlines    ZSET of queued ids with a deadline, score = deadline (ms)
 *   P st:<n>       ZSET of ids in state n (score id): LIST and counts
 *   P all          ZSET of every id (score id)
 *   P idem:<key>   STRING id, SET with a 24 h TTL
 *   P unpub        ZSET of succeeded ids whose publication marker (exec.c)
 *                  may still exist, score = completion time
 *   P run          STREAM, one entry per lease {id, att}; consumer group
 *                  "spindle", consumer = lease owner. The pending-entry list
 *                  is the lease table: idle time = time since the lease was
 *                  taken or last renewed (XCLAIM resets it), and XAUTOCLAIM
 *                  finds the expired ones.
 *   P waiting      STREAM mirroring the number of queued jobs, for KEDA: its
 *                  consumer group "spindle" has a lag (XINFO GROUPS) equal to
 *                  the number of jobs in state queued (ZCARD P st:0). A job
 *                  entering queued XADDs one token, a job leaving it reads
 *                  one (XREADGROUP ... NOACK), in the same script. Tokens are
 *                  counters, not job ids. Read tokens are trimmed with XTRIM
 *                  MINID, never XDEL: a deleted entry past the group's last
 *                  id makes Redis report the lag as unknown. Drift (a queue
 *                  written without the mirror, a restored RDB) is repaired on
 *                  connect and by every sweep.
 *   P kids:<id>    ZSET of the segments of job <id>, score = segment index
 *   P ended        ZSET of the jobs (not segments) that ended, score = when
 *                  (ms): retention deletes the oldest (RQ_LUA_PURGE)
 *   P ended_fill   STRING, how far the jobs that ended before P ended
 *                  existed have been added to it (an id of P all; "done")
 *   P outputs      HASH output path -> the last job submitted with it
 *   P readers:<path>  SET of the jobs submitted with input <path>; ended
 *                  ones are removed when a submit reads the set
 * (a job's files are checked against these by the submit script, and
 *  recorded by it; segments' files are neither)
 *   P events       HASH of job lifecycle counters, by event (submitted leased
 *                  succeeded failed dead cancelled released), HINCRBY in the
 *                  script of each transition: the queue's own count, whoever
 *                  made the move (docs/operations.md, spindle_queue_events_total)
 *   P repair       HASH, where the repair of the pipelines' sets is (ready_repair)
 *   P seen         HASH pipeline -> ms: when a worker that runs it was last
 *                  said to be there (rq_present, HSET outside the scripts;
 *                  field "\n": a worker of any pipeline)
 *   P workers      HASH worker -> its record (JSON): the roster behind
 *                  WORKERS (roster.c; rq_roster_put, outside the scripts)
 * Job fields: id st pr att max spec idem own rsn errs cr dl nb lu cs gs pd pt
 *   cx (cancel requested) sid (stream entry of the live lease) t0..t5 (last
 *   time the job entered each state) fo (FIFO rank) ho (has outputs) pl (its
 *   pipeline, which a lease may filter on);
 *   segments (docs/jobs.md): par (a segment's job, 0 none) si (its index)
 *   pn (a job's segments not yet succeeded: it is queued but not in P ready
 *   until that is 0, when its join can run).
 *   P seq and P fifo are INCR counters.
 * States: 0 queued, 1 running, 2 succeeded, 3 failed, 4 cancelled, 5 dead.
 * ARGV[1] is always P. Not for Redis Cluster: the scripts name keys they
 * compute (one Redis, or a primary with replicas). */
#ifndef SPINDLE_QUEUE_REDIS_LUA_H
#define SPINDLE_QUEUE_REDIS_LUA_H

#define RQ_LUA_PRELUDE                                                                          \
  "local P = ARGV[1]\n"                                                                         \
  "local G = 'spindle'\n"                                                                       \
  "local W = P .. 'waiting'\n"                                                                  \
  "local function jk(id) return P .. 'job:' .. id end\n"                                        \
  /* The job an idempotency key names within the window (ms), or nil.    \
   * (The key expires with the window too; cr decides, as the clocks of    \
   * the writers may differ from the server's.) */                         \
  "local function idem_job(key, now, window)\n"                                                 \
  "  local v = redis.call('GET', P .. 'idem:' .. key)\n"                                        \
  "  if not v then return nil end\n"                                                            \
  "  local cr = tonumber(redis.call('HGET', jk(v), 'cr'))\n"                                    \
  "  if cr and now - cr < window then return tonumber(v) end\n"                                 \
  "  return nil\n"                                                                              \
  "end\n"                                                                                       \
  /* One token per job that became queued. The mirror's commands go       \
   * through pcall: a stream deleted or overwritten by hand must not stop   \
   * the transition half done (a script is not rolled back); the repair of  \
   * the next sweep puts the count right. */                                                    \
  "local function wait_put(n)\n"                                                                \
  "  for _ = 1, n do redis.pcall('XADD', W, '*', 't', 1) end\n"                                  \
  "end\n"                                                                                       \
  /* Take n tokens (the oldest: any token stands for any queued job) and     \
   * trim them. */                                                                             \
  "local function wait_take(n)\n"                                                               \
  "  local got = redis.pcall('XREADGROUP', 'GROUP', G, 'tokens', 'COUNT', n, 'NOACK',\n"        \
  "                          'STREAMS', W, '>')\n"                                              \
  "  if type(got) ~= 'table' or not got[1] then return 0 end\n"                                 \
  "  local es = got[1][2]\n"                                                                    \
  "  if #es > 0 then redis.pcall('XTRIM', W, 'MINID', es[#es][1]) end\n"                        \
  "  return #es\n"                                                                              \
  "end\n"                                                                                       \
  /* Make the group's lag equal the number of queued jobs; -> tokens added  \
   * (negative: taken). A lag Redis cannot compute (an entry removed with   \
   * XDEL) or a missing stream or group rebuilds the stream. At most         \
   * WAIT_CHUNK tokens a call (35 ms of Redis), so a big queue's mirror is   \
   * made over several sweeps, not in one long script. */                    \
  "local WAIT_CHUNK = 10000\n"                                                                  \
  "local function wait_repair()\n"                                                              \
  "  local n = redis.call('ZCARD', P .. 'st:0')\n"                                              \
  "  local lag = nil\n"                                                                         \
  "  local groups = redis.pcall('XINFO', 'GROUPS', W)\n"                                        \
  "  if type(groups) == 'table' and not groups.err then\n"                                      \
  "    for _, g in ipairs(groups) do\n"                                                         \
  "      local f = {}\n"                                                                        \
  "      for j = 1, #g, 2 do f[g[j]] = g[j + 1] end\n"                                          \
  "      if f['name'] == G then\n"                                                              \
  /* no field at all: Redis before 7 keeps no lag, so there is nothing to    \
   * compare (false is a lag Redis cannot compute) */                                          \
  "        if f['lag'] == nil then return 0 end\n"                                              \
  "        lag = tonumber(f['lag'])\n"                                                          \
  "      end\n"                                                                                 \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "  if not lag then\n"                                                                         \
  "    redis.call('DEL', W)\n"                                                                  \
  "    redis.call('XGROUP', 'CREATE', W, G, '0', 'MKSTREAM')\n"                                 \
  "    lag = 0\n"                                                                               \
  "  end\n"                                                                                     \
  "  local d = math.max(math.min(n - lag, WAIT_CHUNK), -WAIT_CHUNK)\n"                          \
  "  if d > 0 then wait_put(d) elseif d < 0 then wait_take(-d) end\n"                           \
  "  return d\n"                                                                                \
  "end\n"                                                                                       \
  /* P ready:<pipeline> holds the same entries as P ready, by pipeline, for  \
   * leases that ask for some pipelines only; P pls names every pipeline that  \
   * has had one. A job's pipeline: its field pl, or (a job stored before pl  \
   * was kept) the one its spec names. */  \
  "local function rk(pl) return P .. 'ready:' .. pl end\n"                                      \
  "local function spec_pipeline(spec)\n"                                                        \
  "  local ok, sp = pcall(cjson.decode, spec or '')\n"                                          \
  "  return ok and type(sp) == 'table' and type(sp.pipeline) == 'string' and sp.pipeline or ''\n" \
  "end\n"                                                                                       \
  "local function pl_of(k)\n"                                                                   \
  "  return redis.call('HGET', k, 'pl') or spec_pipeline(redis.call('HGET', k, 'spec'))\n"      \
  "end\n"                                                                                       \
  "local function ready(id)\n"                                                                  \
  "  local h = redis.call('HMGET', jk(id), 'pr', 'fo')\n"                                       \
  "  local sc = -tonumber(h[1]) * 4294967296 + tonumber(h[2])\n"                                \
  "  local pl = pl_of(jk(id))\n"                                                                \
  "  redis.call('ZADD', P .. 'ready', sc, id)\n"                                                \
  "  redis.call('ZADD', rk(pl), sc, id)\n"                                                      \
  "  redis.call('SADD', P .. 'pls', pl)\n"                                                      \
  "end\n"                                                                                       \
  "local function unready(id)\n"                                                                \
  "  redis.call('ZREM', P .. 'ready', id)\n"                                                    \
  "  redis.call('ZREM', rk(pl_of(jk(id))), id)\n"                                               \
  "end\n"                                                                                       \
  "local function unqueue(id)\n"                                                                \
  "  unready(id)\n"                                                                             \
  "  redis.call('ZREM', P .. 'delayed', id)\n"                                                  \
  "  redis.call('ZREM', P .. 'deadlines', id)\n"                                                \
  "end\n"                                                                                       \
  /* The pipelines' sets hold the entries of P ready, by pipeline. When     \
   * their sizes do not add up to P ready's (a queue written before they    \
   * were kept, or by such a version during a rolling upgrade), each call   \
   * (every sweep) repairs at most REPAIR_CHUNK entries, so no call holds   \
   * Redis for long however big the queue: first it adds P ready's entries  \
   * to their sets in score order, then it drops, set by set, the entries   \
   * whose job is no longer in P ready. P repair keeps the place: phase     \
   * (ph), set (pl), last score done (at; scores are unique). -> entries    \
   * looked at. */                                                          \
  "local REPAIR_CHUNK = 1000\n"                                                                 \
  "local function ready_repair()\n"                                                             \
  "  local RP = P .. 'repair'\n"                                                                \
  "  local c = redis.call('HMGET', RP, 'ph', 'pl', 'at')\n"                                     \
  "  if not c[1] then\n"                                                                        \
  "    local m = 0\n"                                                                           \
  "    for _, pl in ipairs(redis.call('SMEMBERS', P .. 'pls')) do m = m + redis.call('ZCARD', rk(pl)) end\n" \
  "    if m == redis.call('ZCARD', P .. 'ready') then return 0 end\n"                           \
  "    c = {'add', false, '-inf'}\n"                                                            \
  "  end\n"                                                                                     \
  "  local ph, cpl, at = c[1], c[2], c[3]\n"                                                    \
  "  local lo = at == '-inf' and at or '(' .. at\n"                                             \
  "  local got\n"                                                                               \
  "  if ph == 'add' then\n"                                                                     \
  "    got = redis.call('ZRANGEBYSCORE', P .. 'ready', lo, '+inf', 'WITHSCORES', 'LIMIT', 0, REPAIR_CHUNK)\n" \
  "    for i = 1, #got, 2 do\n"                                                                 \
  "      local pl = pl_of(jk(got[i]))\n"                                                        \
  "      redis.call('ZADD', rk(pl), got[i + 1], got[i])\n"                                      \
  "      redis.call('SADD', P .. 'pls', pl)\n"                                                  \
  "    end\n"                                                                                   \
  "    if #got < 2 * REPAIR_CHUNK then ph, cpl = 'drop', false end\n"                           \
  "  else\n"                                                                                    \
  "    if cpl then\n"                                                                           \
  "      got = redis.call('ZRANGEBYSCORE', rk(cpl), lo, '+inf', 'WITHSCORES', 'LIMIT', 0, REPAIR_CHUNK)\n" \
  "      for i = 1, #got, 2 do\n"                                                               \
  "        if not redis.call('ZSCORE', P .. 'ready', got[i]) then redis.call('ZREM', rk(cpl), got[i]) end\n" \
  "      end\n"                                                                                 \
  "    else\n"                                                                                  \
  "      got = {}\n"                                                                            \
  "    end\n"                                                                                   \
  "    if #got < 2 * REPAIR_CHUNK then\n"                                                       \
  "      local nxt\n"                                                                           \
  "      for _, pl in ipairs(redis.call('SMEMBERS', P .. 'pls')) do\n"                          \
  "        if (not cpl or pl > cpl) and (not nxt or pl < nxt) then nxt = pl end\n"              \
  "      end\n"                                                                                 \
  "      if not nxt then\n"                                                                     \
  "        redis.call('DEL', RP)\n"                                                             \
  "        return #got / 2\n"                                                                   \
  "      end\n"                                                                                 \
  "      cpl, got = nxt, {}\n"                                                                  \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "  at = #got > 0 and got[#got] or '-inf'\n"                                                   \
  "  redis.call('HSET', RP, 'ph', ph, 'at', at)\n"                                              \
  "  if cpl then redis.call('HSET', RP, 'pl', cpl) else redis.call('HDEL', RP, 'pl') end\n"     \
  "  return #got / 2\n"                                                                         \
  "end\n"                                                                                       \
  "local function add_error(k, att, now, reason)\n"                                             \
  "  local errs = cjson.decode(redis.call('HGET', k, 'errs') or '[]')\n"                        \
  "  errs[#errs + 1] = {attempt = tonumber(att), at = now, error = reason}\n"                   \
  "  redis.call('HSET', k, 'errs', cjson.encode(errs))\n"                                       \
  "end\n"                                                                                       \
  "local SN = {'queued', 'running', 'succeeded', 'failed', 'cancelled', 'dead'}\n"               \
  /* P events: the event each move into a state counts (a failed attempt   \
   * that is retried, and a release, count where they happen) */            \
  "local function ev(name) redis.call('HINCRBY', P .. 'events', name, 1) end\n"                \
  "local EV = {[1] = 'leased', [2] = 'succeeded', [3] = 'failed', [4] = 'cancelled',\n"        \
  "            [5] = 'dead'}\n"                                                                \
  "local setst\n"                                                                               \
  /* A queued job is cancelled, or fails with `why` without running (past   \
   * its deadline, or a segment of it ended badly). */                                          \
  "local function cancel_queued(id, why, now)\n"                                                \
  "  unqueue(id)\n"                                                                             \
  "  redis.call('HSET', jk(id), 'rsn', why, 'pn', 0)\n"                                         \
  "  setst(id, 0, 4, now)\n"                                                                    \
  "end\n"                                                                                       \
  "local function fail_queued(id, why, now)\n"                                                  \
  "  local k = jk(id)\n"                                                                        \
  "  unqueue(id)\n"                                                                             \
  "  add_error(k, redis.call('HGET', k, 'att'), now, why)\n"                                    \
  "  redis.call('HSET', k, 'rsn', why, 'nb', 0, 'pn', 0)\n"                                     \
  "  setst(id, 0, 3, now)\n"                                                                    \
  "end\n"                                                                                       \
  /* Segments, on a segment's or a segmented job's move to a final state   \
   * (the same rules as the SQLite queue's, in the same script as the move): \
   * a succeeded segment is one fewer for its job, which becomes ready at   \
   * 0; a segment that ends otherwise fails its waiting job, and a job that \
   * ends cancels its queued segments and asks the running ones to stop.   */                   \
  "local function kids_stop(id, why, now)\n"                                                    \
  "  for _, c in ipairs(redis.call('ZRANGE', P .. 'kids:' .. id, 0, -1)) do\n"                  \
  "    local st = redis.call('HGET', jk(c), 'st')\n"                                             \
  "    if st == '0' then\n"                                                                     \
  "      cancel_queued(c, why, now)\n"                                                          \
  "    elseif st == '1' then\n"                                                                 \
  "      redis.call('HSET', jk(c), 'cx', 1)\n"                                                  \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  "local function segment_ended(id, to, now)\n"                                                 \
  "  local h = redis.call('HMGET', jk(id), 'par', 'si', 'rsn')\n"                                \
  "  local par = tonumber(h[1]) or 0\n"                                                         \
  "  if to >= 3 and redis.call('EXISTS', P .. 'kids:' .. id) == 1 then\n"                       \
  "    local why = 'the job was cancelled'\n"                                                   \
  "    if to ~= 4 then why = 'the job ' .. SN[to + 1] end\n"                                     \
  "    kids_stop(id, why, now)\n"                                                               \
  "  end\n"                                                                                     \
  "  if par == 0 then return end\n"                                                             \
  "  local pk = jk(par)\n"                                                                      \
  "  local p = redis.call('HMGET', pk, 'st', 'pn')\n"                                            \
  "  local pn = tonumber(p[2]) or 0\n"                                                          \
  "  if p[1] ~= '0' or pn <= 0 then return end\n"                                               \
  "  if to == 2 then\n"                                                                         \
  "    pn = redis.call('HINCRBY', pk, 'pn', -1)\n"                                               \
  "    if pn == 0 then ready(par) end\n"                                                        \
  "    return\n"                                                                                \
  "  end\n"                                                                                     \
  "  local msg = 'segment ' .. (h[2] or '?') .. ' (job ' .. id .. ') ' .. SN[to + 1] .. ': ' ..\n"  \
  "              (h[3] or '')\n"                                                                \
  "  fail_queued(par, msg, now)\n"                                                               \
  "end\n"                                                                                       \
  /* Every state change but a submission goes through here, so the mirror   \
   * follows state queued, and segments their job, whatever the transition. */                  \
  "setst = function(id, from, to, now)\n"                                                       \
  "  redis.call('HSET', jk(id), 'st', to, 't' .. to, now)\n"                                    \
  "  if from >= 0 then redis.call('ZREM', P .. 'st:' .. from, id) end\n"                        \
  "  redis.call('ZADD', P .. 'st:' .. to, id, id)\n"                                            \
  "  if from == 0 and to ~= 0 then wait_take(1) end\n"                                          \
  "  if to == 0 and from ~= 0 then wait_put(1) end\n"                                           \
  "  if to >= 2 then segment_ended(id, to, now) end\n"                                          \
  /* a job (not a segment) that ended, for retention (RQ_LUA_PURGE) */     \
  "  if to >= 2 and (tonumber(redis.call('HGET', jk(id), 'par')) or 0) == 0 then\n"              \
  "    redis.call('ZADD', P .. 'ended', now, id)\n"                                              \
  "  end\n"                                                                                     \
  "  if EV[to] and from ~= to then ev(EV[to]) end\n"                                          \
  "end\n"                                                                                       \
  "local function requeue_deadline(id)\n"                                                       \
  "  local dl = tonumber(redis.call('HGET', jk(id), 'dl'))\n"                                   \
  "  if dl and dl > 0 then redis.call('ZADD', P .. 'deadlines', dl, id) end\n"                  \
  "end\n"                                                                                       \
  "local function unrun(k)\n"                                                                   \
  "  local sid = redis.call('HGET', k, 'sid')\n"                                                \
  "  if sid and sid ~= '' then\n"                                                               \
  "    redis.call('XACK', P .. 'run', G, sid)\n"                                                \
  "    redis.call('XDEL', P .. 'run', sid)\n"                                                   \
  "  end\n"                                                                                     \
  "  redis.call('HDEL', k, 'own', 'sid', 'lu')\n"                                               \
  "end\n"                                                                                       \
  /* An attempt's transfers (docs/jobs.md): ARGV[first .. first + 7] are    \
   * its bytes then its ns by direction, added to fields xb0..xb3, xn0..xn3. */ \
  "local function add_xfer(k, first)\n"                                                        \
  "  for i = 0, 7 do\n"                                                                         \
  "    local v = ARGV[first + i]\n"                                                             \
  "    if v and v ~= '0' then\n"                                                                \
  "      local f = 'xb' .. i\n"                                                                 \
  "      if i >= 4 then f = 'xn' .. (i - 4) end\n"                                              \
  "      redis.call('HINCRBY', k, f, v)\n"                                                      \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  "local function holds(k, att, owner)\n"                                                       \
  "  local h = redis.call('HMGET', k, 'st', 'att', 'own')\n"                                    \
  "  return h[1] == '1' and h[2] == att and h[3] == owner\n"                                    \
  "end\n"                                                                                       \
  "local function backoff(att, r, base, max)\n"                                                 \
  "  local d = base * 2 ^ (att - 1)\n"                                                          \
  "  if d > max then d = max end\n"                                                             \
  "  local h = math.floor(d / 2)\n"                                                             \
  "  return d - h + math.floor(r * (h + 1))\n"                                                  \
  "end\n"                                                                                       \
  /* The failure path shared by worker reports, expired leases and lost     \
   * workers: the job is running. Returns the new state. */                                   \
  "local function fail_attempt(id, reason, cancelled, cs, gs, now, r, base, max, final)\n"             \
  "  local k = jk(id)\n"                                                                        \
  "  local h = redis.call('HMGET', k, 'att', 'max', 'cx', 'pr')\n"                              \
  "  local att, mx = tonumber(h[1]), tonumber(h[2])\n"                                          \
  "  unrun(k)\n"                                                                                \
  "  redis.call('HINCRBYFLOAT', k, 'cs', cs)\n"                                                 \
  "  redis.call('HINCRBYFLOAT', k, 'gs', gs)\n"                                                 \
  "  if cancelled or h[3] == '1' then\n"                                                        \
  "    redis.call('HSET', k, 'rsn', reason)\n"                                                  \
  "    setst(id, 1, 4, now)\n"                                                                  \
  "    return 4\n"                                                                              \
  "  end\n"                                                                                     \
  "  add_error(k, att, now, reason)\n"                                                          \
  "  if att < mx and not final then\n"                                                                        \
  "    local nb = now + backoff(att, r, base, max)\n"                                           \
  "    redis.call('HSET', k, 'nb', nb)\n"                                                       \
  "    redis.call('ZADD', P .. 'delayed', nb, id)\n"                                            \
  "    requeue_deadline(id)\n"                                                                  \
  "    setst(id, 1, 0, now)\n"                                                                  \
  "    ev('failed')\n"                                                                           \
  "    return 0\n"                                                                              \
  "  end\n"                                                                                     \
  "  local ns = 3\n"                                                                            \
  "  if mx > 1 and not final then ns = 5 end\n"                                                               \
  "  redis.call('HSET', k, 'rsn', reason)\n"                                                    \
  "  setst(id, 1, ns, now)\n"                                                                   \
  "  return ns\n"                                                                               \
  "end\n"

/* ARGV: P spec priority idem_key deadline max_attempts now idem_ttl_ms
 *       id ('' = take the next) has_outputs (0|1) parent seg_index pending
 *       check (0|1)
 *       -> {id, existed (0|1)}, or {0, 2, kind, path, job, state, cx} when
 *       check is 1 and a file of the job clashes with one of a job queued or
 *       running (spn_clash_kind_t; nothing is stored then)
 * A job with pending > 0 waits for that many segments before it is ready;
 * a segment (parent > 0) is listed in P kids:<parent>.
 * FIFO order within a priority is the order of the scripts (P fifo), not of
 * the ids: a gateway allocates ids in blocks to pipeline its submissions. */
#define RQ_LUA_SUBMIT                                                                           \
  "local now = tonumber(ARGV[7])\n"                                                             \
  "local key = ARGV[4]\n"                                                                       \
  "if key ~= '' then\n"                                                                         \
  "  local v = idem_job(key, now, tonumber(ARGV[8]))\n"                                         \
  "  if v then return {v, 1} end\n"                                                             \
  "end\n"                                                                                       \
  /* the job's files: each output path's last job (P outputs) and each   \
   * input path's readers (P readers:<path>), for a job not a segment;     \
   * checked first against the jobs queued or running */                    \
  "local sp = nil\n"                                                                            \
  "if tonumber(ARGV[11]) == 0 then\n"                                                           \
  "  local ok, v = pcall(cjson.decode, ARGV[2])\n"                                              \
  "  if ok and type(v) == 'table' then sp = v end\n"                                            \
  "end\n"                                                                                       \
  "local function paths(t)\n"                                                                   \
  "  local out = {}\n"                                                                          \
  "  if sp and type(sp[t]) == 'table' then\n"                                                   \
  "    for _, path in pairs(sp[t]) do\n"                                                        \
  "      if type(path) == 'string' then out[#out + 1] = path end\n"                             \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "  return out\n"                                                                              \
  "end\n"                                                                                       \
  "local outs, ins = paths('outputs'), paths('inputs')\n"                                       \
  "if ARGV[14] == '1' then\n"                                                                   \
  "  local function live(j)\n"                                                                  \
  "    if not j then return nil end\n"                                                          \
  "    local h = redis.call('HMGET', jk(j), 'st', 'cx')\n"                                      \
  "    if h[1] == '0' or h[1] == '1' then return {tonumber(j), tonumber(h[1]), tonumber(h[2] or 0)} end\n" \
  "    return nil\n"                                                                            \
  "  end\n"                                                                                     \
  "  for _, path in ipairs(outs) do\n"                                                          \
  "    local h = live(redis.call('HGET', P .. 'outputs', path))\n"                              \
  "    if h then return {0, 2, 1, path, h[1], h[2], h[3]} end\n"                                \
  /* readers that have ended are dropped from the set on the way (a job    \
   * never becomes queued again once it has ended) */                      \
  "    local rdk = P .. 'readers:' .. path\n"                                                   \
  "    for _, r in ipairs(redis.call('SMEMBERS', rdk)) do\n"                                     \
  "      h = live(r)\n"                                                                         \
  "      if h then return {0, 2, 2, path, h[1], h[2], h[3]} end\n"                              \
  "      redis.call('SREM', rdk, r)\n"                                                          \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "  for _, path in ipairs(ins) do\n"                                                           \
  "    local h = live(redis.call('HGET', P .. 'outputs', path))\n"                              \
  "    if h then return {0, 2, 3, path, h[1], h[2], h[3]} end\n"                                \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  "local id = tonumber(ARGV[9])\n"                                                              \
  "if not id then id = redis.call('INCR', P .. 'seq') end\n"                                     \
  "local k = jk(id)\n"                                                                          \
  "local fo = redis.call('INCR', P .. 'fifo')\n"                                                \
  /* the pipeline, for leases that ask for some pipelines only */          \
  "local pl = spec_pipeline(ARGV[2])\n"                                                         \
  /* one HSET with every field, state queued (0) entered now */             \
  "redis.call('HSET', k, 'id', id, 'pr', ARGV[3], 'att', 0, 'max', ARGV[6], 'spec', ARGV[2],\n" \
  "  'cr', now, 'dl', ARGV[5], 'nb', 0, 'errs', '[]', 'cs', 0, 'gs', 0, 'pd', 0, 'pt', 0,\n"    \
  "  'fo', fo, 'ho', ARGV[10], 'st', 0, 't0', now, 'par', ARGV[11], 'si', ARGV[12],\n"          \
  "  'pn', ARGV[13], 'pl', pl)\n"                                                              \
  "if tonumber(ARGV[11]) > 0 then redis.call('ZADD', P .. 'kids:' .. ARGV[11], ARGV[12], id) end\n" \
  "for _, path in ipairs(outs) do redis.call('HSET', P .. 'outputs', path, id) end\n"           \
  "for _, path in ipairs(ins) do redis.call('SADD', P .. 'readers:' .. path, id) end\n"        \
  "if key ~= '' then\n"                                                                         \
  "  redis.call('HSET', k, 'idem', key)\n"                                                      \
  "  redis.call('SET', P .. 'idem:' .. key, id, 'PX', ARGV[8])\n"                               \
  "end\n"                                                                                       \
  "redis.call('ZADD', P .. 'st:0', id, id)\n"                                                   \
  "ev('submitted')\n"                                                                           \
  "wait_put(1)\n"                                                                               \
  "redis.call('ZADD', P .. 'all', id, id)\n"                                                    \
  "if tonumber(ARGV[13]) == 0 then ready(id) end\n"                                            \
  "if tonumber(ARGV[5]) > 0 then redis.call('ZADD', P .. 'deadlines', ARGV[5], id) end\n"       \
  "return {id, 0}\n"

/* ARGV: P owner now lease_ms pipelines -> HGETALL of the leased job, or
 * false. pipelines: "" for any (the head of P ready); else "\nname\n...\n":
 * the best-placed head of those pipelines' P ready:<name>, so jobs of other
 * pipelines stay where they are for a worker that runs them. */
#define RQ_LUA_LEASE                                                                            \
  "local now = tonumber(ARGV[3])\n"                                                             \
  "local F = ARGV[5] ~= '' and ARGV[5] or nil\n"                                                \
  "local due = redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'LIMIT', 0, 256)\n"     \
  "for _, id in ipairs(due) do\n"                                                               \
  "  redis.call('ZREM', P .. 'delayed', id)\n"                                                  \
  "  ready(id)\n"                                                                               \
  "end\n"                                                                                       \
  "while true do\n"                                                                             \
  "  local id, from\n"                                                                          \
  "  if F then\n"                                                                               \
  "    local best\n"                                                                            \
  "    for name in string.gmatch(F, '[^\\n]+') do\n"                                            \
  "      local t = redis.call('ZRANGE', rk(name), 0, 0, 'WITHSCORES')\n"                        \
  "      if #t > 0 and (not best or tonumber(t[2]) < best) then id, from, best = t[1], name, tonumber(t[2]) end\n" \
  "    end\n"                                                                                   \
  "    if not id then return false end\n"                                                       \
  "  else\n"                                                                                    \
  "    local top = redis.call('ZRANGE', P .. 'ready', 0, 0)\n"                                  \
  "    if #top == 0 then return false end\n"                                                    \
  "    id = top[1]\n"                                                                           \
  "  end\n"                                                                                     \
  /* an entry of a pipeline's set whose job is not in P ready (an older   \
   * version moved it: leased it, or put it back to wait its backoff):      \
   * dropped, and the job left where it is */                                \
  "  local stale = from and not redis.call('ZSCORE', P .. 'ready', id)\n"                       \
  "  unready(id)\n"                                                                             \
  "  if from then redis.call('ZREM', rk(from), id) end\n"                                       \
  "  local k = jk(id)\n"                                                                        \
  "  local h = redis.call('HMGET', k, 'st', 'dl')\n"                                            \
  /* past its deadline: left queued for the sweep to fail */  \
  "  local dl = tonumber(h[2]) or 0\n"                                                          \
  "  if not stale and h[1] == '0' and (dl == 0 or dl >= now) then\n"                            \
  "    local att = redis.call('HINCRBY', k, 'att', 1)\n"                                        \
  "    local sid = redis.call('XADD', P .. 'run', '*', 'id', id, 'att', att)\n"                 \
  "    local got = redis.call('XREADGROUP', 'GROUP', G, ARGV[2], 'COUNT', 1,\n"                 \
  "                           'STREAMS', P .. 'run', '>')\n"                                    \
  "    if got[1][2][1][1] ~= sid then return redis.error_reply('lease stream out of step') end\n" \
  "    redis.call('HSET', k, 'own', ARGV[2], 'sid', sid, 'lu', now + tonumber(ARGV[4]),\n"      \
  "               'pd', 0, 'pt', 0)\n"                                                          \
  "    redis.call('ZREM', P .. 'deadlines', id)\n"                                              \
  "    setst(id, 0, 1, now)\n"                                                                  \
  "    return redis.call('HGETALL', k)\n"                                                       \
  "  end\n"                                                                                     \
  "end\n"

/* ARGV: P id att owner now lease_ms -> 1 | 2 (cancel requested) | 0 (not held) */
#define RQ_LUA_RENEW                                                                            \
  "local k = jk(ARGV[2])\n"                                                                     \
  "if not holds(k, ARGV[3], ARGV[4]) then return 0 end\n"                                       \
  "local sid = redis.call('HGET', k, 'sid')\n"                                                  \
  "redis.call('XCLAIM', P .. 'run', G, ARGV[4], 0, sid, 'JUSTID')\n"                            \
  "redis.call('HSET', k, 'lu', tonumber(ARGV[5]) + tonumber(ARGV[6]))\n"                        \
  "if redis.call('HGET', k, 'cx') == '1' then return 2 end\n"                                   \
  "return 1\n"

/* ARGV: P id done total */
#define RQ_LUA_PROGRESS                                                                         \
  "local k = jk(ARGV[2])\n"                                                                     \
  "if redis.call('HGET', k, 'st') ~= '1' then return 0 end\n"                                   \
  "redis.call('HSET', k, 'pd', ARGV[3], 'pt', ARGV[4])\n"                                       \
  "return 1\n"

/* ARGV: P id att owner compute_s gpu_s now xfer(8: bytes, ns by direction)
 * warnings ("" none) -> 1 | 0. A succeeded job's progress is complete:
 * done = total (1 of 1 when it never reported). */
#define RQ_LUA_COMPLETE                                                                         \
  "local k = jk(ARGV[2])\n"                                                                     \
  "if not holds(k, ARGV[3], ARGV[4]) then return 0 end\n"                                       \
  "unrun(k)\n"                                                                                  \
  "redis.call('HINCRBYFLOAT', k, 'cs', ARGV[5])\n"                                              \
  "redis.call('HINCRBYFLOAT', k, 'gs', ARGV[6])\n"                                              \
  "add_xfer(k, 8)\n"                                                                            \
  "if ARGV[16] ~= '' then redis.call('HSET', k, 'wn', ARGV[16]) else redis.call('HDEL', k, 'wn') end\n" \
  "local pt = tonumber(redis.call('HGET', k, 'pt')) or 0\n"                                     \
  "if pt == 0 then pt = 1 end\n"                                                                \
  "redis.call('HSET', k, 'pd', pt, 'pt', pt)\n"                                                 \
  "setst(ARGV[2], 1, 2, tonumber(ARGV[7]))\n"                                                   \
  "if redis.call('HGET', k, 'ho') == '1' then\n"                                               \
  "  redis.call('ZADD', P .. 'unpub', ARGV[7], ARGV[2])\n"                                       \
  "end\n"                                                                                       \
  "return 1\n"

/* ARGV: P id att owner reason how cs gs now r base max xfer(8)
 * (how: 0 retry, 1 cancelled, 2 final: no retry) -> state | -1 */
#define RQ_LUA_FAIL                                                                             \
  "local k = jk(ARGV[2])\n"                                                                     \
  "if not holds(k, ARGV[3], ARGV[4]) then return -1 end\n"                                      \
  "add_xfer(k, 13)\n"                                      \
  "return fail_attempt(ARGV[2], ARGV[5], ARGV[6] == '1', ARGV[7], ARGV[8], tonumber(ARGV[9]),\n" \
  "                    tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), ARGV[6] == '2')\n"

/* ARGV: P id now -> state; -1 no such job; -2 - state: already terminal */
#define RQ_LUA_CANCEL                                                                           \
  "local id = ARGV[2]\n"                                                                        \
  "local k = jk(id)\n"                                                                          \
  "local st = redis.call('HGET', k, 'st')\n"                                                    \
  "if not st then return -1 end\n"                                                              \
  "if st == '0' then\n"                                                                         \
  "  cancel_queued(id, 'cancelled while queued', tonumber(ARGV[3]))\n"                          \
  "  return 4\n"                                                                                \
  "end\n"                                                                                       \
  "if st == '1' then\n"                                                                         \
  "  redis.call('HSET', k, 'cx', 1)\n"                                                          \
  "  return 1\n"                                                                                \
  "end\n"                                                                                       \
  "return -2 - tonumber(st)\n"

/* ARGV: P now min_idle_ms r base max -> {id, state, id, state, ...}
 * Expired leases (pending entries idle >= min_idle) count as a failed
 * attempt; queued jobs past their deadline fail; succeeded jobs whose
 * marker was not confirmed removed within min_idle come back as state 2
 * (the caller removes the marker). Last, the waiting mirror is checked
 * against the queued jobs and repaired (wait_repair). */
#define RQ_LUA_SWEEP                                                                            \
  "local now = tonumber(ARGV[2])\n"                                                             \
  "local r0, base, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])\n"             \
  "local out = {}\n"                                                                            \
  "local got = redis.call('XAUTOCLAIM', P .. 'run', G, 'spindle-sweeper', ARGV[3], '0-0',\n"    \
  "                       'COUNT', 100)\n"                                                      \
  "for i, e in ipairs(got[2]) do\n"                                                             \
  "  if e and e[2] then\n"                                                                      \
  "    local f = {}\n"                                                                          \
  "    for j = 1, #e[2], 2 do f[e[2][j]] = e[2][j + 1] end\n"                                   \
  "    local k = jk(f['id'])\n"                                                                 \
  "    local h = redis.call('HMGET', k, 'st', 'att', 'sid', 'cx')\n"                            \
  "    if h[1] == '1' and h[2] == f['att'] and h[3] == e[1] then\n"                             \
  "      local why = 'lease expired (worker lost or stalled)'\n"                                \
  "      if h[4] == '1' then why = 'cancelled (worker lost)' end\n"                             \
  "      local r = (r0 + i * 0.6180339887) % 1\n"                                               \
  "      out[#out + 1] = tonumber(f['id'])\n"                                                   \
  "      out[#out + 1] = fail_attempt(f['id'], why, false, 0, 0, now, r, base, max)\n"          \
  "    else\n"                                                                                  \
  "      redis.call('XACK', P .. 'run', G, e[1])\n"                                             \
  "      redis.call('XDEL', P .. 'run', e[1])\n"                                                \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  /* succeeded jobs whose publication marker nobody removed (the client     \
   * died between complete and the unlink): hand them to this sweeper */    \
  "local up = redis.call('ZRANGEBYSCORE', P .. 'unpub', '-inf', now - tonumber(ARGV[3]),\n"      \
  "                      'LIMIT', 0, 100)\n"                                                    \
  "for _, id in ipairs(up) do\n"                                                                \
  "  redis.call('ZREM', P .. 'unpub', id)\n"                                                    \
  "  out[#out + 1] = tonumber(id)\n"                                                            \
  "  out[#out + 1] = 2\n"                                                                       \
  "end\n"                                                                                       \
"local dl = redis.call('ZRANGEBYSCORE', P .. 'deadlines', '-inf', '(' .. now, 'LIMIT', 0, 256)\n" \
  "for _, id in ipairs(dl) do\n"                                                                \
  "  redis.call('ZREM', P .. 'deadlines', id)\n"                                                \
  "  if redis.call('HGET', jk(id), 'st') == '0' then\n"                                         \
  "    fail_queued(id, 'deadline passed while queued', now)\n"                                  \
  "    out[#out + 1] = tonumber(id)\n"                                                          \
  "    out[#out + 1] = 3\n"                                                                     \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  "wait_repair()\n"                                                                             \
  "ready_repair()\n"                                                                            \
  "return out\n"

/* ARGV: P id att owner now -> 1 | 0. Back to the queue, attempt not counted. */
#define RQ_LUA_RELEASE                                                                          \
  "local id = ARGV[2]\n"                                                                        \
  "local k = jk(id)\n"                                                                          \
  "if not holds(k, ARGV[3], ARGV[4]) or redis.call('HGET', k, 'cx') == '1' then return 0 end\n" \
  "unrun(k)\n"                                                                                  \
  "redis.call('HINCRBY', k, 'att', -1)\n"                                                       \
  "redis.call('HSET', k, 'nb', 0)\n"                                                            \
  "ready(id)\n"                                                    \
  "requeue_deadline(id)\n"                                                                      \
  "setst(id, 1, 0, tonumber(ARGV[5]))\n"                                                        \
  "ev('released')\n"                                                                            \
  "return 1\n"

/* ARGV: P owner reason now r base max -> {id, state, ...} */
#define RQ_LUA_RELEASE_OWNER                                                                    \
  "local now = tonumber(ARGV[4])\n"                                                             \
  "local out = {}\n"                                                                            \
  "local pend = redis.call('XPENDING', P .. 'run', G, '-', '+', 10000, ARGV[2])\n"              \
  "for i, p in ipairs(pend) do\n"                                                               \
  "  local e = redis.call('XRANGE', P .. 'run', p[1], p[1])\n"                                  \
  "  if #e == 1 then\n"                                                                         \
  "    local f = {}\n"                                                                          \
  "    for j = 1, #e[1][2], 2 do f[e[1][2][j]] = e[1][2][j + 1] end\n"                          \
  "    local k = jk(f['id'])\n"                                                                 \
  "    if holds(k, f['att'], ARGV[2]) then\n"                                                   \
  "      local why = ARGV[3]\n"                                                                 \
  "      if redis.call('HGET', k, 'cx') == '1' then why = 'cancelled (worker lost)' end\n"      \
  "      local r = (tonumber(ARGV[5]) + i * 0.6180339887) % 1\n"                                \
  "      out[#out + 1] = tonumber(f['id'])\n"                                                   \
  "      out[#out + 1] = fail_attempt(f['id'], why, false, 0, 0, now, r, tonumber(ARGV[6]),\n"  \
  "                                   tonumber(ARGV[7]))\n"                                     \
  "    end\n"                                                                                   \
  "  else\n"                                                                                    \
  "    redis.call('XACK', P .. 'run', G, p[1])\n"                                               \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  "return out\n"

/* ARGV: P state(-1 any) limit -> {HGETALL, HGETALL, ...} newest first */
#define RQ_LUA_LIST                                                                             \
  "local z = P .. 'all'\n"                                                                      \
  "if tonumber(ARGV[2]) >= 0 then z = P .. 'st:' .. ARGV[2] end\n"                              \
  "local ids = redis.call('ZREVRANGE', z, 0, tonumber(ARGV[3]) - 1)\n"                          \
  "local out = {}\n"                                                                            \
  "for _, id in ipairs(ids) do out[#out + 1] = redis.call('HGETALL', jk(id)) end\n"             \
  "return out\n"

/* ARGV: P id -> {HGETALL, ...} of its segments, by index */
#define RQ_LUA_CHILDREN                                                                         \
  "local out = {}\n"                                                                            \
  "for _, c in ipairs(redis.call('ZRANGE', P .. 'kids:' .. ARGV[2], 0, -1)) do\n"               \
  "  out[#out + 1] = redis.call('HGETALL', jk(c))\n"                                            \
  "end\n"                                                                                       \
  "return out\n"

/* ARGV: P before limit -> jobs deleted.
 * Retention: up to `limit` jobs (not segments) that ended before `before`
 * (ms), oldest first, each with its segments and its records (state sets,
 * output and input records that name it, its idempotency key). Kept for a
 * later call: a job with a segment queued or running, or whose publication
 * marker may still exist (P unpub). Jobs that ended before P ended existed
 * are added to it first, FILL a call. */
#define RQ_LUA_PURGE                                                                            \
  "local limit = tonumber(ARGV[3])\n"                                                          \
  "local FILL = 2000\n"                                                                         \
  "local fk = P .. 'ended_fill'\n"                                                              \
  "local from = redis.call('GET', fk) or '-inf'\n"                                              \
  "if from ~= 'done' then\n"                                                                    \
  "  if from ~= '-inf' then from = '(' .. from end\n"                                           \
  "  local ids = redis.call('ZRANGEBYSCORE', P .. 'all', from, '+inf', 'LIMIT', 0, FILL)\n"       \
  "  for _, id in ipairs(ids) do\n"                                                             \
  "    local h = redis.call('HMGET', jk(id), 'st', 'par')\n"                                     \
  "    local st = tonumber(h[1])\n"                                                             \
  "    if st and st >= 2 and (tonumber(h[2]) or 0) == 0 then\n"                                 \
  "      local at = tonumber(redis.call('HGET', jk(id), 't' .. st)) or 0\n"                      \
  "      redis.call('ZADD', P .. 'ended', 'NX', at, id)\n"                                       \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "  if #ids < FILL then redis.call('SET', fk, 'done') else redis.call('SET', fk, ids[#ids]) end\n" \
  "end\n"                                                                                       \
  "local function files(spec)\n"                                                                \
  "  local ok, sp = pcall(cjson.decode, spec or '')\n"                                          \
  "  if not ok or type(sp) ~= 'table' then return {}, {} end\n"                                 \
  "  local o = type(sp.outputs) == 'table' and sp.outputs or {}\n"                              \
  "  local i = type(sp.inputs) == 'table' and sp.inputs or {}\n"                                \
  "  return o, i\n"                                                                             \
  "end\n"                                                                                       \
  "local function drop(id)\n"                                                                   \
  "  local k = jk(id)\n"                                                                        \
  "  local h = redis.call('HMGET', k, 'st', 'spec', 'idem', 'pl')\n"                              \
  "  if h[1] then redis.call('ZREM', P .. 'st:' .. h[1], id) end\n"                              \
  "  local outs, ins = files(h[2])\n"                                                           \
  "  for _, path in pairs(outs) do\n"                                                           \
  "    if type(path) == 'string' and redis.call('HGET', P .. 'outputs', path) == tostring(id) then\n" \
  "      redis.call('HDEL', P .. 'outputs', path)\n"                                            \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "  for _, path in pairs(ins) do\n"                                                            \
  "    if type(path) == 'string' then redis.call('SREM', P .. 'readers:' .. path, id) end\n"     \
  "  end\n"                                                                                     \
  "  if h[3] and h[3] ~= '' and redis.call('GET', P .. 'idem:' .. h[3]) == tostring(id) then\n"  \
  "    redis.call('DEL', P .. 'idem:' .. h[3])\n"                                               \
  "  end\n"                                                                                     \
  "  for _, z in ipairs({'all', 'ended', 'unpub', 'ready', 'delayed', 'deadlines'}) do\n"        \
  "    redis.call('ZREM', P .. z, id)\n"                                                        \
  "  end\n"                                                                                     \
  "  if h[4] then redis.call('ZREM', rk(h[4]), id) end\n"                                       \
  "  redis.call('DEL', k, P .. 'kids:' .. id)\n"                                                \
  "end\n"                                                                                       \
  "local n = 0\n"                                                                               \
  "for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'ended', '-inf', '(' .. ARGV[2], 'LIMIT', 0, limit)) do\n" \
  "  local st = tonumber(redis.call('HGET', jk(id), 'st'))\n"                                    \
  "  if not st or st < 2 then\n"                                                                \
  "    redis.call('ZREM', P .. 'ended', id)\n"                                                  \
  "  elseif not redis.call('ZSCORE', P .. 'unpub', id) then\n"                                  \
  "    local kids = redis.call('ZRANGE', P .. 'kids:' .. id, 0, -1)\n"                           \
  "    local live = false\n"                                                                    \
  "    for _, c in ipairs(kids) do\n"                                                           \
  "      local cs = redis.call('HGET', jk(c), 'st')\n"                                           \
  "      if cs == '0' or cs == '1' or redis.call('ZSCORE', P .. 'unpub', c) then live = true end\n" \
  "    end\n"                                                                                   \
  "    if not live then\n"                                                                      \
  "      for _, c in ipairs(kids) do drop(c) end\n"                                             \
  "      drop(id)\n"                                                                            \
  "      n = n + 1\n"                                                                           \
  "    end\n"                                                                                   \
  "  end\n"                                                                                     \
  "end\n"                                                                                       \
  "if n > 0 then redis.call('HINCRBY', P .. 'events', 'deleted', n) end\n"                      \
  "return n\n"

/* ARGV: P -> tokens added to P waiting (negative: taken) to repair drift */
#define RQ_LUA_WAITING_REPAIR "ready_repair()\nreturn wait_repair()\n"

/* ARGV: P id: the publication marker of a succeeded job is gone */
#define RQ_LUA_UNPUBLISHED "redis.call('ZREM', ARGV[1] .. 'unpub', ARGV[2])\nreturn 1\n"

#endif
