-- Append one outbox message to a stream unless its idempotency key was appended within
-- the dedupe window. Runs atomically, so a re-sent message never gets a second entry.
--
-- KEYS[1]  the stream
-- KEYS[2]  the dedupe key for (stream, idempotency key)
-- ARGV[1]  the window in milliseconds
-- ARGV[2]  MAXLEN ~ threshold, or '' for no trimming
-- ARGV[3]  '1' when the caller waits for durability (WAIT / WAITAOF) after the batch
-- ARGV[4..] the entry's field/value pairs
--
-- Returns {entry id, 1} for a new entry, {first entry id, 0} for a duplicate.

local first = redis.call('GET', KEYS[2])
if first then
  if ARGV[3] == '1' then
    -- A write on this connection, so the caller's WAIT / WAITAOF also covers the first
    -- append even when that one was made on a connection that has since been lost.
    redis.call('SET', KEYS[2], first, 'KEEPTTL')
  end
  return {first, 0}
end

local args = {KEYS[1]}
if ARGV[2] ~= '' then
  args[#args + 1] = 'MAXLEN'
  args[#args + 1] = '~'
  args[#args + 1] = ARGV[2]
end
args[#args + 1] = '*'
for i = 4, #ARGV do
  args[#args + 1] = ARGV[i]
end

-- XADD first: if it fails, no dedupe key is left behind to hide the message.
local id = redis.call('XADD', unpack(args))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {id, 1}
