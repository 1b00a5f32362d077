/// A payload APNs accepts but a device will not honour as written: the job is still sent, and the
/// code is recorded in its `trap_ids` (PW101–PW107) so the producer can find and fix it.
public struct PayloadWarning: Sendable, Hashable, CustomStringConvertible {
    /// The warning's code.
    public var trapID: TrapID
    /// What is wrong and how to fix it, in one sentence.
    public var message: String

    /// Creates a warning.
    public init(trapID: TrapID, message: String) {
        self.trapID = trapID
        self.message = message
    }

    public var description: String { "\(self.trapID.rawValue): \(self.message)" }

    /// Apple's interruption levels.
    public static let interruptionLevels: Set<String> = ["passive", "active", "time-sensitive", "critical"]
}
