-- First calls with unique operation keys over @SPREAD@ consumer(s) (profiles plain-0 ...), one
-- session per consumer; with @REPLAY_KEYS@ above zero, calls of that many fixed keys instead
-- (after the first call of each, replays).
n = 0
math.randomseed(os.time())
local run = tostring(math.random(1, 1000000000))
request = function()
  n = n + 1
  local c = n % @SPREAD@
  local key = 'k-' .. run .. '-' .. n
  if @REPLAY_KEYS@ > 0 then
    key = 'k-replay-' .. (n % @REPLAY_KEYS@)
    c = 0
  end
  local body = '{"profile":"plain-' .. c .. '","operation_key":"' .. key ..
    '","session_id":"s' .. c .. '","input_revision":"r1","intent":"perf",' ..
    '"input":{"messages":[{"role":"user","content":"summarize order 123"}]}}'
  return wrk.format("POST", "/v1/calls",
    {["content-type"] = "application/json", ["authorization"] = "Bearer @KEY@"}, body)
end
