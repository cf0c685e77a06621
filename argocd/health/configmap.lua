-- ArgoCD health of ConfigMaps: placement maps (label gpuplace.io/placement-map=true) report the
-- gpuplace controller's verdict from the annotation gpuplace.io/status; every other ConfigMap is
-- Healthy, as ArgoCD treats ConfigMaps without this script.
--
--   no status yet, or a status of other content -> Progressing (the controller has not read
--                                                  this version of placement.yaml yet)
--   Valid, pods drifted         -> Progressing (pods run where the map no longer puts them)
--   Valid                       -> Healthy
--   Invalid, Conflict, Degraded -> Degraded, with the controller's message
--
-- "Other content": the status carries observedDataHash, a fingerprint of the placement.yaml the
-- controller validated (placement/status.py data_hash); right after a sync the object holds new
-- text and the previous verdict, which must not show as the new one's.
--
-- The status is JSON and ArgoCD's Lua has no JSON library, so a small decoder follows. It needs
-- the string library: argocd-cm sets resource.customizations.useOpenLibs.ConfigMap: "true".
-- Mirrored in argocd/argocd-cm.yaml; tests/unit/chart/test_argocd_health.py keeps the two identical.

local STATUS = "gpuplace.io/status"
local MAP_LABEL = "gpuplace.io/placement-map"
local DATA_KEY = "placement.yaml"

-- Two polynomial hashes modulo primes below 2^31: every intermediate value stays below 2^40, exact
-- in the float64 numbers of ArgoCD's Lua. Must equal placement.status.data_hash.
local function data_hash(text)
  local h1, h2 = 0, 0
  for i = 1, #text do
    local b = string.byte(text, i) + 1
    h1 = (h1 * 257 + b) % 2147483647
    h2 = (h2 * 263 + b) % 2147483629
  end
  return string.format("%d-%d-%d", #text, h1, h2)
end

local function decode_json(text)
  local pos = 1

  local function fail(what)
    error("position " .. pos .. ": " .. what, 0)
  end

  local function skip()
    pos = string.find(text, "[^ \t\r\n]", pos) or (#text + 1)
  end

  local function utf8(code)
    if code < 0x80 then
      return string.char(code)
    elseif code < 0x800 then
      return string.char(0xC0 + math.floor(code / 0x40), 0x80 + code % 0x40)
    elseif code < 0x10000 then
      return string.char(0xE0 + math.floor(code / 0x1000),
        0x80 + math.floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
    end
    return string.char(0xF0 + math.floor(code / 0x40000), 0x80 + math.floor(code / 0x1000) % 0x40,
      0x80 + math.floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
  end

  local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
    r = "\r", t = "\t" }

  local function hex4()
    local digits = string.sub(text, pos, pos + 3)
    if not string.find(digits, "^%x%x%x%x$") then
      fail("bad \\u escape")
    end
    pos = pos + 4
    return tonumber(digits, 16)
  end

  local value

  local function parse_string()
    pos = pos + 1 -- opening quote
    local parts = {}
    while true do
      local c = string.sub(text, pos, pos)
      if c == "" then
        fail("unterminated string")
      elseif c == '"' then
        pos = pos + 1
        return table.concat(parts)
      elseif c == "\\" then
        local e = string.sub(text, pos + 1, pos + 1)
        pos = pos + 2
        if e == "u" then
          local code = hex4()
          if code >= 0xD800 and code <= 0xDBFF and string.sub(text, pos, pos + 1) == "\\u" then
            local saved = pos
            pos = pos + 2
            local low = hex4()
            if low >= 0xDC00 and low <= 0xDFFF then
              code = 0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00)
            else
              pos = saved
            end
          end
          if code >= 0xD800 and code <= 0xDFFF then
            code = 0xFFFD -- a lone surrogate: the replacement character, as JSON decoders do
          end
          table.insert(parts, utf8(code))
        elseif escapes[e] then
          table.insert(parts, escapes[e])
        else
          fail("bad escape \\" .. e)
        end
      else
        local stop = string.find(text, '["\\]', pos) or (#text + 1)
        table.insert(parts, string.sub(text, pos, stop - 1))
        pos = stop
      end
    end
  end

  -- An object or an array, from its opening bracket: `member` reads one member into the result;
  -- members are separated by ',' up to `close`.
  local function parse_members(close, member)
    pos = pos + 1
    local result = {}
    skip()
    if string.sub(text, pos, pos) == close then
      pos = pos + 1
      return result
    end
    while true do
      member(result)
      skip()
      local c = string.sub(text, pos, pos)
      pos = pos + 1
      if c == close then
        return result
      elseif c ~= "," then
        fail("expected ',' or '" .. close .. "'")
      end
    end
  end

  local function parse_object()
    return parse_members("}", function(result)
      skip()
      if string.sub(text, pos, pos) ~= '"' then
        fail("expected a key")
      end
      local key = parse_string()
      skip()
      if string.sub(text, pos, pos) ~= ":" then
        fail("expected ':'")
      end
      pos = pos + 1
      result[key] = value()
    end)
  end

  local function parse_array()
    return parse_members("]", function(result)
      table.insert(result, value())
    end)
  end

  value = function()
    skip()
    local c = string.sub(text, pos, pos)
    if c == "{" then
      return parse_object()
    elseif c == "[" then
      return parse_array()
    elseif c == '"' then
      return parse_string()
    end
    for literal, result in pairs({ ["true"] = true, ["false"] = false, ["null"] = false }) do
      if string.sub(text, pos, pos + #literal - 1) == literal then
        pos = pos + #literal
        return result
      end
    end
    local number = string.match(string.sub(text, pos), "^-?%d+%.?%d*[eE]?[-+]?%d*")
    if number and number ~= "" and tonumber(number) then
      pos = pos + #number
      return tonumber(number)
    end
    fail("unexpected " .. (c == "" and "end of text" or "'" .. c .. "'"))
  end

  local result = value()
  skip()
  if pos <= #text then
    fail("unexpected text after the value")
  end
  return result
end

-- The first located error, e.g. "placement.yaml:7:15: device 9 is ...", when there is no message.
local function first_error(status)
  local errors = status.errors
  if type(errors) ~= "table" or type(errors[1]) ~= "table" then
    return nil
  end
  local e = errors[1]
  local where = tostring(e.source or "")
  if type(e.line) == "number" and e.line > 0 then
    where = where .. ":" .. e.line .. ":" .. tostring(e.column or 0)
  end
  return where .. ": " .. tostring(e.message or "")
end

local function health(o)
  local hs = {}
  local metadata = o.metadata or {}
  local labels = metadata.labels or {}
  if labels[MAP_LABEL] ~= "true" then
    hs.status = "Healthy"
    return hs
  end
  local annotations = metadata.annotations or {}
  local raw = annotations[STATUS]
  if raw == nil or raw == "" then
    hs.status = "Progressing"
    hs.message = "waiting for the gpuplace controller to validate this placement map"
    return hs
  end
  local ok, status = pcall(decode_json, raw)
  if ok and not string.find(raw, "^%s*{") then
    ok, status = false, "not an object"
  end
  if not ok or type(status) ~= "table" then
    hs.status = "Degraded"
    hs.message = STATUS .. " is not a JSON object (" .. tostring(status) .. ")"
    return hs
  end
  local seen = status.observedDataHash
  if type(seen) == "string" and seen ~= "" then
    local data = o.data or {}
    local text = data[DATA_KEY]
    if type(text) ~= "string" then
      text = ""
    end
    if data_hash(text) ~= seen then
      hs.status = "Progressing"
      hs.message = "waiting for the gpuplace controller to validate this version of the placement map"
      return hs
    end
  end
  local phase = status.phase
  local message = status.message
  if type(message) ~= "string" or message == "" then
    message = first_error(status)
  end
  local slots = status.slots
  local drifted = type(slots) == "table" and slots.drifted or 0
  if phase == "Valid" and type(drifted) == "number" and drifted > 0 then
    hs.status = "Progressing"
    hs.message = drifted .. " pod(s) drifted: bound to slots this version of the map moved or removed"
    if type(status.rollout) == "string" and status.rollout ~= "" then
      hs.message = hs.message .. " (rollout " .. status.rollout .. ")"
    end
  elseif phase == "Valid" then
    hs.status = "Healthy"
    hs.message = message or "placement map is valid"
  elseif phase == "Invalid" or phase == "Conflict" or phase == "Degraded" then
    hs.status = "Degraded"
    hs.message = phase .. ": " .. (message or "see the gpuplace.io/status annotation")
  else
    hs.status = "Unknown"
    hs.message = "unknown gpuplace.io/status phase " .. tostring(phase)
  end
  return hs
end

return health(obj)
