public import Foundation
public import PushCore

/// A clock whose wall time a test decides (`{ base }`, a shifted `Date()`), its monotonic side the continuous
/// clock's: for the parts that read only wall time (the token caches).
public struct WallClock: PushClock {
    private let wall: @Sendable () -> Date

    public init(_ wall: @escaping @Sendable () -> Date) {
        self.wall = wall
    }

    public var wallNow: Date { self.wall() }
    public var now: ContinuousClock.Instant { ContinuousClock.now }
    public var minimumResolution: Duration { ContinuousClock().minimumResolution }

    public func sleep(until deadline: ContinuousClock.Instant, tolerance: Duration? = nil) async throws {
        try await ContinuousClock().sleep(until: deadline, tolerance: tolerance)
    }
}
