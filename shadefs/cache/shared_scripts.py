"""The shared tier's Lua scripts, one per operation (admit, set the budget, delete, heartbeat, rescore,
touch). Redis runs a script alone: every key a partition's script touches shares the partition's hash
tag (:mod:`shadefs.cache.shared` has the layout), so it runs on one cluster node, atomically."""

__all__ = ["ADMIT", "SET_CAP", "DELETE", "HEARTBEAT", "RESCORE", "TOUCH"]

# KEYS: zset, sizes, meta, value key.  ARGV: member, score, size, payload, mode, value-key prefix
ADMIT = r"""
local z, s, m, vk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, size, mode, prefix = ARGV[1], tonumber(ARGV[3]), ARGV[5], ARGV[6]
if redis.call('ZSCORE', z, member) then return {1, 0} end
local cap = tonumber(redis.call('HGET', m, 'cap') or '0')
if size > cap then return {0, 0} end
local score = tonumber(ARGV[2])
if mode == 'lru' or mode == 'fifo' then
  local t = redis.call('TIME'); score = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local used = tonumber(redis.call('HGET', m, 'used') or '0')
local need = used + size - cap
local victims, freed = {}, 0
if need > 0 then
  if mode == 'static' then return {0, 0} end
  local start = 0
  while freed < need do
    local batch = redis.call('ZRANGE', z, start, start + 31, 'WITHSCORES')
    if #batch == 0 then return {0, 0} end
    for i = 1, #batch, 2 do
      if mode == 'imp' and tonumber(batch[i + 1]) >= score then return {0, 0} end
      victims[#victims + 1] = batch[i]
      freed = freed + tonumber(redis.call('HGET', s, batch[i]) or '0')
      if freed >= need then break end
    end
    start = start + 32
  end
  for _, v in ipairs(victims) do
    redis.call('DEL', prefix .. v)
    redis.call('ZREM', z, v)
    redis.call('HDEL', s, v)
  end
  redis.call('HINCRBY', m, 'evictions', #victims)
end
redis.call('SET', vk, ARGV[4])
redis.call('ZADD', z, score, member)
redis.call('HSET', s, member, size)
redis.call('HSET', m, 'used', used - freed + size)
redis.call('HINCRBY', m, 'files', 1 - #victims)
return {2, #victims}
"""

# KEYS: zset, sizes, meta.  ARGV: cap, gen, value-key prefix, most victims per call.
# Returns {applied, evicted, more}: more = 1 when the partition is still over its cap (call again). One call
# evicts at most ARGV[4] values, so Redis, which runs a script alone, is never blocked for long by a shrink.
SET_CAP = r"""
local z, s, m = KEYS[1], KEYS[2], KEYS[3]
local cap, gen, prefix, most = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local g = tonumber(redis.call('HGET', m, 'gen') or '-1')
if gen < g then return {0, 0, 0} end
redis.call('HSET', m, 'cap', cap, 'gen', gen)
local used = tonumber(redis.call('HGET', m, 'used') or '0')
local n = 0
while used > cap and n < most do
  local v = redis.call('ZRANGE', z, 0, 0)[1]
  if not v then used = 0; break end
  used = used - tonumber(redis.call('HGET', s, v) or '0')
  redis.call('DEL', prefix .. v)
  redis.call('ZREM', z, v)
  redis.call('HDEL', s, v)
  n = n + 1
end
if n > 0 then
  redis.call('HSET', m, 'used', used)
  redis.call('HINCRBY', m, 'files', -n)
  redis.call('HINCRBY', m, 'evictions', n)
end
if used > cap then return {1, n, 1} end
return {1, n, 0}
"""

# KEYS: zset, sizes, meta, value key.  ARGV: member.  Returns 1 when it was resident.
DELETE = r"""
local z, s, m, vk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local size = redis.call('HGET', s, ARGV[1])
redis.call('DEL', vk)
if not size then return 0 end
redis.call('ZREM', z, ARGV[1])
redis.call('HDEL', s, ARGV[1])
redis.call('HINCRBY', m, 'used', -tonumber(size))
redis.call('HINCRBY', m, 'files', -1)
return 1
"""

# KEYS: members, sizes, meta.  ARGV: member id, bytes (-1: leave), ttl ms.  Returns {gen, total, count}.
HEARTBEAT = r"""
local mem, sz, meta = KEYS[1], KEYS[2], KEYS[3]
local id, bytes, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local changed = false
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', mem, '-inf', now)) do
  redis.call('ZREM', mem, dead); redis.call('HDEL', sz, dead); changed = true
end
if bytes < 0 then
  if redis.call('ZREM', mem, id) == 1 then changed = true end
  redis.call('HDEL', sz, id)
else
  if not redis.call('ZSCORE', mem, id) or tonumber(redis.call('HGET', sz, id) or '-1') ~= bytes then
    changed = true
  end
  redis.call('ZADD', mem, now + ttl, id)
  redis.call('HSET', sz, id, bytes)
end
if changed then redis.call('HINCRBY', meta, 'gen', 1) end
local total = 0
for _, v in ipairs(redis.call('HVALS', sz)) do total = total + tonumber(v) end
return {tonumber(redis.call('HGET', meta, 'gen') or '0'), total, redis.call('ZCARD', mem)}
"""

# KEYS: zset.  ARGV: score, member, score, member, ...  Updates resident members only (ZADD XX).
RESCORE = r"""
local n = 0
for i = 1, #ARGV, 2 do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[i], ARGV[i + 1]) end
return n
"""

# KEYS: zset.  ARGV: member.  An LRU hit: move to the most recent end (server time).
TOUCH = r"""
local t = redis.call('TIME')
return redis.call('ZADD', KEYS[1], 'XX', tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000, ARGV[1])
"""
