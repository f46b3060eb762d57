-- wrk script of bench/coordinator.py: send pre-built signed reports, each once, in order.
--
-- RBROKER_WRK_PLAN names a plan file, one line per wrk thread: `PORT TOTAL PATH`. Run wrk
-- with as many threads as lines and as many connections as threads (`-t N -c N`): each
-- thread then owns one connection, one server port and one request file. The request file
-- holds TOTAL raw HTTP requests, each after a line with its length in bytes; the computers
-- of one file are nobody else's, so each computer's seq order holds on the wire.
--
-- A thread sends request k + 1 only after the answer to request k (no pipelining), counts
-- the answers (200 with "applied": true / 200 otherwise / any other status), stops after
-- the last one and prints `rbroker-wrk finished ID` on stdout. done() prints one line per
-- thread: `rbroker-wrk result ID APPLIED NOT_APPLIED ERRORS ANSWERED TOTAL T_FIRST T_LAST`
-- (CLOCK_MONOTONIC seconds, the clock of Python's time.monotonic(): the first request
-- written, the last answer read) and one `rbroker-wrk socket CONNECT READ WRITE TIMEOUT`.

local ffi = require("ffi")
ffi.cdef([[
typedef struct { long tv_sec; long tv_nsec; } rbroker_timespec;
int clock_gettime(int clk_id, rbroker_timespec *tp);
]])
local CLOCK_MONOTONIC = 1
local ts = ffi.new("rbroker_timespec")

local function now()
   ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
   return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- ------------------------------------------------------------ setup (main state)

local plan = nil
local threads = {}

local function read_plan()
   local path = os.getenv("RBROKER_WRK_PLAN")
   if not path then
      error("RBROKER_WRK_PLAN is not set (bench/coordinator.py sets it)")
   end
   local out = {}
   for line in io.lines(path) do
      local port, total, file = line:match("^(%d+) (%d+) (.+)$")
      if port then
         out[#out + 1] = { port = port, total = tonumber(total), file = file }
      end
   end
   return out
end

function setup(thread)
   plan = plan or read_plan()
   local index = #threads + 1
   local entry = plan[index]
   if not entry then
      error(("wrk started more threads than the plan's %d lines"):format(#plan))
   end
   thread.addr = wrk.lookup("127.0.0.1", entry.port)[1]
   thread:set("id", index)
   thread:set("file", entry.file)
   thread:set("total", entry.total)
   thread:set("host", "127.0.0.1:" .. entry.port)
   threads[index] = thread
end

-- ------------------------------------------------------------ running (thread states)

local reqs = {}
applied, not_applied, errors, answered = 0, 0, 0, 0
t_first, t_last = 0, 0

function init(args)
   local f = assert(io.open(file, "rb"))
   local data = f:read("*a")
   f:close()
   local pos = 1
   while pos <= #data do
      local nl = data:find("\n", pos, true)
      local n = tonumber(data:sub(pos, nl - 1))
      reqs[#reqs + 1] = data:sub(nl + 1, nl + n)
      pos = nl + n + 1
   end
   if #reqs ~= total then
      error(("%s holds %d requests, the plan says %d"):format(file, #reqs, total))
   end
   -- sent once all are answered (never, unless wrk asks again before stopping)
   idle = wrk.format("GET", "/healthz", { Host = host })
end

function request()
   -- the next unanswered request: a resend after a reconnect repeats it (then answered
   -- "not applied"), and wrk's own check call before the threads start sends nothing
   local k = answered + 1
   if k == 1 then
      t_first = now()
   end
   return reqs[k] or idle
end

function response(status, headers, body)
   if answered >= total then
      return
   end
   answered = answered + 1
   t_last = now()
   if status ~= 200 then
      errors = errors + 1
   elseif body:find('"applied"%s*:%s*true') then
      applied = applied + 1
   else
      not_applied = not_applied + 1
   end
   if answered == total then
      io.write(("rbroker-wrk finished %d\n"):format(id))
      io.stdout:flush()
      wrk.thread:stop()
   end
end

-- ------------------------------------------------------------ done (main state)

function done(summary, latency, requests)
   for index, thread in ipairs(threads) do
      io.write(("rbroker-wrk result %d %d %d %d %d %d %.6f %.6f\n"):format(
         index,
         thread:get("applied"),
         thread:get("not_applied"),
         thread:get("errors"),
         thread:get("answered"),
         thread:get("total"),
         thread:get("t_first"),
         thread:get("t_last")
      ))
   end
   local e = summary.errors
   io.write(("rbroker-wrk socket %d %d %d %d\n"):format(e.connect, e.read, e.write, e.timeout))
   io.stdout:flush()
end
