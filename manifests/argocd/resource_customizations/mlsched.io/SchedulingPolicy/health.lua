-- Argo CD health of a SchedulingPolicy, from the conditions the mlsched operator writes after
-- each scheduling round (docs/operator.md, "Learned models"):
--   Degraded     Ready=False (a spec the operator cannot use, or a round that failed), or
--                ModelLoaded=False: a learned model is missing or refused, and the policy
--                schedules with spec.fallback until it is fixed; or Ready=True/FallbackActive
--                for another reason (an algorithm name the operator does not know)
--   Healthy      Ready=True and the models it needs loaded (ModelLoaded=True)
--   Progressing  no round yet, or an edit the latest round has not seen
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

local function explain(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

local ready = condition("Ready")
local model = condition("ModelLoaded")

local generation = obj.metadata.generation

-- A spec the operator refuses is reported as soon as it says so (no round runs for it); once
-- the spec is edited, the verdict waits for the operator to look at the new generation.
if ready ~= nil and ready.status == "False" and
    (generation == nil or ready.observedGeneration == nil or ready.observedGeneration >= generation) then
  hs.status = "Degraded"
  hs.message = explain(ready)
  return hs
end

local observed = obj.status and obj.status.observedGeneration
if ready == nil or ready.status == "False" or model == nil or
    (generation ~= nil and (observed == nil or observed < generation)) then
  hs.status = "Progressing"
  hs.message = "Waiting for a scheduling round"
  if generation ~= nil and ready ~= nil then
    hs.message = hs.message .. " of generation " .. generation
  end
  return hs
end

if model.status == "False" then
  hs.status = "Degraded"
  hs.message = explain(model)
elseif ready.reason == "FallbackActive" then
  -- Scheduling, but not with what the spec asks for (e.g. an algorithm name it does not know).
  hs.status = "Degraded"
  hs.message = explain(ready)
elseif model.status == "True" and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = explain(model)
else
  hs.status = "Progressing"
  hs.message = explain(model)
end
return hs
