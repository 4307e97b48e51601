-- wrk script for bench/proxy: POST the body in $BENCH_BODY with the runner's headers,
-- and print one line `BENCH_JSON {...}` at the end with exact latency percentiles (us)
-- and request / error counts. The same script (same headers) is used direct and through
-- the runner, so both sides parse the same bytes.

wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Tenant-ID"] = os.getenv("BENCH_TENANT") or "bench"
wrk.headers["X-Priority"] = os.getenv("BENCH_PRIORITY") or "normal"

-- BENCH_TENANTS=a,b,c: each request names the next tenant in turn (bench/tenants).
local tenants = {}
for t in string.gmatch(os.getenv("BENCH_TENANTS") or "", "[^,]+") do tenants[#tenants + 1] = t end
if #tenants > 0 then
  local turn = 0
  request = function()
    turn = turn % #tenants + 1
    wrk.headers["X-Tenant-ID"] = tenants[turn]
    return wrk.format()
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local fields = {
    string.format('"requests":%d', summary.requests),
    string.format('"duration_us":%d', summary.duration),
    string.format('"bytes":%d', summary.bytes),
    string.format('"err_connect":%d', e.connect),
    string.format('"err_read":%d', e.read),
    string.format('"err_write":%d', e.write),
    string.format('"err_status":%d', e.status),
    string.format('"err_timeout":%d', e.timeout),
    string.format('"lat_mean_us":%.1f', latency.mean),
    string.format('"lat_min_us":%d', latency.min),
    string.format('"lat_max_us":%d', latency.max),
  }
  for _, p in ipairs({50, 90, 99, 99.9}) do
    fields[#fields + 1] = string.format('"lat_p%s_us":%d', tostring(p), latency:percentile(p))
  end
  io.write("BENCH_JSON {" .. table.concat(fields, ",") .. "}\n")
end
