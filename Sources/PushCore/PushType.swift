/// Apple's `apns-push-type`, with the rules each carries: the topic suffix, the default and allowed
/// priorities, and the payload ceiling.
public enum PushType: String, Sendable, Hashable, CaseIterable, Codable {
    case alert, background, liveactivity, voip, complication, fileprovider, mdm, location, pushtotalk, widgets, controls

    /// What `apns-topic` appends to the bare bundle id for this push type (APNS.md, "Topic by push type").
    public var topicSuffix: String {
        switch self {
        case .alert, .background, .mdm: ""
        case .liveactivity: ".push-type.liveactivity"
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .location: ".location-query"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .controls: ".push-type.controls"
        }
    }

    /// The priority sent when the job names none: 5 for background and Live Activity, 10 otherwise.
    public var defaultPriority: Int {
        switch self {
        case .background, .liveactivity: 5
        default: 10
        }
    }

    /// The priorities APNs accepts for this push type (background: 5 or 1).
    public var allowedPriorities: Set<Int> {
        self == .background ? [5, 1] : [10, 5, 1]
    }

    /// Whether `priority` is allowed for this push type: ``allowedPriorities`` without building a set per job.
    public func allows(priority: Int) -> Bool {
        priority == 5 || priority == 1 || (priority == 10 && self != .background)
    }

    /// The payload ceiling in UTF-8 bytes: 5120 for VoIP, 4096 otherwise (broadcasts: ``PushType/broadcastPayloadLimit``).
    public var payloadLimit: Int {
        self == .voip ? 5_120 : 4_096
    }

    /// The payload ceiling of an iOS 18 broadcast.
    public static let broadcastPayloadLimit = 5_120

    /// Every suffix a bare bundle id must not carry (trap MS018), longest first.
    public static let knownTopicSuffixes: [String] = PushType.allCases.map(\.topicSuffix).filter { !$0.isEmpty }
        .sorted { $0.count > $1.count }

    /// The suffix `topic` already carries, if any: `.voip`, `.push-type.liveactivity`, or any `.push-type.…`.
    public static func suffix(in topic: String) -> String? {
        // Bytes for ASCII topics (every bundle id): Foundation's range(of:) went through CFString, and the
        // standard library's firstRange(of:) through a generic searcher, at 6 % of a worker's samples.
        if let answer = topic.utf8.withContiguousStorageIfAvailable({ Self.asciiSuffix(in: $0) }), let answer {
            return answer
        }
        // Non-ASCII: range(of:) and hasSuffix match by canonical equivalence, which a byte search does not.
        if let known = knownTopicSuffixes.first(where: { topic.hasSuffix($0) }) { return known }
        return topic.range(of: ".push-type.").map { String(topic[$0.lowerBound...]) }
    }

    private static let knownTopicSuffixBytes = knownTopicSuffixes.map { ($0, Array($0.utf8)) }
    private static let pushTypeMarker = Array(".push-type.".utf8)

    /// `nil`: not ASCII, ask Foundation; `.some(nil)`: no suffix.
    private static func asciiSuffix(in bytes: UnsafeBufferPointer<UInt8>) -> String?? {
        guard bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
        for (known, knownBytes) in knownTopicSuffixBytes
        where bytes.count >= knownBytes.count && bytes.suffix(knownBytes.count).elementsEqual(knownBytes) {
            return .some(known)
        }
        let marker = Self.pushTypeMarker
        guard bytes.count >= marker.count else { return .some(nil) }
        search: for start in 0...(bytes.count - marker.count) {
            for offset in 0..<marker.count where bytes[start + offset] != marker[offset] { continue search }
            return .some(String(decoding: UnsafeBufferPointer(rebasing: bytes[start...]), as: UTF8.self))
        }
        return .some(nil)
    }
}
