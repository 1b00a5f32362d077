import PushCore

/// The process's one clock, made here, at the composition root, and handed to every service, client, cache and
/// probe a command builds: monotonic for timers and deadlines, wall time for rows, tokens, certificates and
/// logs. Library code never reads time any other way, so a test can hand the same parts a `ManualClock`.
let processClock: any PushClock = ContinuousClock()
