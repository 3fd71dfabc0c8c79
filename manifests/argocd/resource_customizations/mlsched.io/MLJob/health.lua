-- Argo CD health of an MLJob, from the status the mlsched operator writes
-- (operator/mlsched/controller/objects/lifecycle.py): status.phase summarises the conditions
-- Admitted, Running, Suspended, Succeeded and Failed, and the Running condition's reason says
-- why a Pending job waits.
--   Healthy      Running (every role has its minimum of ready pods) or Succeeded
--   Suspended    spec.runPolicy.suspend: scaled to zero on purpose
--   Degraded     Failed (InvalidSpec, BackoffLimitExceeded, DeadlineExceeded), or waiting for
--                something only a person can fix: no such SchedulingPolicy (PolicyNotFound),
--                a minimum no set of nodes can ever hold (CannotFit), pods kube-scheduler
--                refuses (Unschedulable), pods the API server refuses to create (PodsRefused)
--                or whose containers cannot start (PodsCannotStart: an image that cannot be
--                pulled), also while Running on its minimum without the rest of its pods
--   Progressing  everything else: not evaluated yet, an edit not yet seen, waiting for an
--                allocation, for the namespace's quota (WaitingForQuota) or for pods to start
-- (Argo CD runs each health.lua on its own, with no way to share code between them: the
-- condition lookup below is repeated in the other kind's script on purpose.)
local hs = {}

local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

-- "Reason: message" of a condition, or the fallback when the condition is absent.
local function explain(c, fallback)
  if c == nil then
    return fallback
  end
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to evaluate the job"
  return hs
end

-- An edited spec is judged once the operator has evaluated that generation.
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

local phase = obj.status.phase
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = explain(condition("Succeeded"), "Succeeded")
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = explain(condition("Failed"), "Failed")
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = explain(condition("Suspended"), "Suspended")
elseif phase == "Running" then
  local running = condition("Running")
  if running ~= nil and (running.reason == "PodsRefused" or running.reason == "PodsCannotStart") then
    hs.status = "Degraded"
  else
    hs.status = "Healthy"
  end
  hs.message = explain(running, "Running")
elseif phase == "Pending" then
  local running = condition("Running")
  local reason = running and running.reason or ""
  if reason == "PolicyNotFound" or reason == "CannotFit" or reason == "Unschedulable"
      or reason == "PodsRefused" or reason == "PodsCannotStart" then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
  hs.message = explain(running, "Pending")
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(phase)
end
return hs
