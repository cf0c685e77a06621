-- ArgoCD health of Applications, for an app of apps (root.yaml): an Application is as healthy as
-- the resources it deployed. ArgoCD reports every Application Healthy without this script, so a
-- sync wave would not wait for the chart's pods before applying the placement maps (wave 0 after
-- the chart's -10): the maps would reach the cluster before the webhook that validates them.
hs = {}
hs.status = "Progressing"
hs.message = "waiting for the Application's own health"
if obj.status ~= nil and obj.status.health ~= nil and obj.status.health.status ~= nil then
  hs.status = obj.status.health.status
  hs.message = obj.status.health.message or ""
end
return hs
