-- ArgoCD health of PlacementMap custom resources (gpuplace.io), from the conditions the gpuplace
-- controller writes into status (placement/resourcestatus.py), first match wins:
--
--   no status, or status.observedGeneration < metadata.generation -> Progressing (the controller
--                                                                     has not read this spec yet)
--   Valid False        -> Degraded, with its message (the last valid version stays in service)
--   Degraded True      -> Degraded, with its message (Conflict, or slots that cannot be served)
--   Progressing True   -> Progressing (compiling, or drifted pods being evicted)
--   Ready True         -> Healthy, with its message (and the drift, when pods drifted)
--   anything else      -> Progressing
--
-- Base and table libraries only: ArgoCD runs it without useOpenLibs. Mirrored in
-- argocd/argocd-cm.yaml; tests/unit/chart/test_argocd.py keeps the two identical.
local hs = { status = "Progressing" }
local status = obj.status
local generation = (obj.metadata and obj.metadata.generation) or 0
if status == nil or status.observedGeneration == nil or status.observedGeneration < generation then
  hs.message = "waiting for the controller to read generation " .. generation
  return hs
end

local found = {}
for _, condition in ipairs(status.conditions or {}) do
  if condition.type ~= nil then
    found[condition.type] = condition
  end
end

local function is(kind, value)
  return found[kind] ~= nil and found[kind].status == value
end

local function message(kind)
  local condition = found[kind]
  if condition == nil then
    return ""
  end
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  return condition.reason or ""
end

if is("Valid", "False") then
  hs.status = "Degraded"
  hs.message = message("Valid")
elseif is("Degraded", "True") then
  hs.status = "Degraded"
  hs.message = message("Degraded")
elseif is("Progressing", "True") then
  hs.message = message("Progressing")
elseif is("Ready", "True") then
  hs.status = "Healthy"
  hs.message = message("Ready")
  if is("Drifted", "True") then
    hs.message = hs.message .. "; " .. message("Drifted")
  end
else
  hs.message = message("Ready")
  if hs.message == "" then
    hs.message = "waiting for the controller's verdict"
  end
end
return hs
