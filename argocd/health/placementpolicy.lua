-- ArgoCD health of the PlacementPolicy custom resource (gpuplace.io, cluster-scoped), from the
-- one condition the gpuplace controller writes into status (controller/policystatus.py):
--
--   no status, or status.observedGeneration < metadata.generation -> Progressing (the controller
--                                                                     has not read this spec yet)
--   Valid False   -> Degraded, with its message (the last valid policy stays in force)
--   Valid True    -> Healthy, with its message ("3 grant(s) in force")
--   anything else -> Progressing
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

local valid = nil
for _, condition in ipairs(status.conditions or {}) do
  if condition.type == "Valid" then
    valid = condition
  end
end

if valid == nil then
  hs.message = "waiting for the controller's verdict"
elseif valid.status == "False" then
  hs.status = "Degraded"
  hs.message = valid.message or valid.reason or ""
elseif valid.status == "True" then
  hs.status = "Healthy"
  hs.message = valid.message or ""
else
  hs.message = valid.message or "waiting for the controller's verdict"
end
return hs
