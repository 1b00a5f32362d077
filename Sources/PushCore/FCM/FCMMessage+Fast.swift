extension FCMMessageBuilder {
    /// The message body spliced from the compact payload's bytes, for the common payload: a plain object of
    /// FCM's fields, `data` with plain string values, `android` without the fields the worker sets. No
    /// Foundation object graph per job (the full parse and serialization cost more than the rest of the send).
    /// `nil`: unusual or refused; the full path decides, and names what is wrong.
    static func splicedBody(
        compact payload: [UInt8],
        token: String,
        androidPriority: String,
        ttl: String,
        collapseKey: String?,
        pushID: String
    ) -> [UInt8]? {
        // Tokens and collapse keys are written as JSON strings: only the plain ones here.
        func plain(_ text: String) -> Bool {
            text.utf8.allSatisfy { $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }
        }
        guard plain(token), collapseKey.map(plain) ?? true else { return nil }
        var scanner = PayloadShape.Scanner(bytes: payload)
        var members: [(key: ArraySlice<UInt8>, value: Range<Int>)] = []
        var data: [Range<Int>] = []
        var android: [Range<Int>] = []
        var seen: Set<ArraySlice<UInt8>> = []
        let ok = scanner.object(depth: 1) { key, scanner in
            guard seen.insert(key).inserted else { return false }
            if key.elementsEqual("data".utf8) || key.elementsEqual("android".utf8) {
                let isData = key.elementsEqual("data".utf8)
                return scanner.object(depth: 2) { inner, scanner in
                    let start = scanner.index - inner.count - 3
                    guard start >= 0, payload[start] == UInt8(ascii: "\"") else { return false }
                    if isData {
                        guard !inner.elementsEqual("push_id".utf8), scanner.string() != nil else { return false }
                    } else {
                        // android.notification: the full path sets its tag.
                        guard !inner.elementsEqual("priority".utf8), !inner.elementsEqual("ttl".utf8),
                            !inner.elementsEqual("collapse_key".utf8), !inner.elementsEqual("data".utf8),
                            !inner.elementsEqual("notification".utf8),
                            scanner.value(depth: 3)
                        else { return false }
                    }
                    // The member, key to value, as written (compact: `"key":value`).
                    if isData { data.append(start..<scanner.index) } else { android.append(start..<scanner.index) }
                    return true
                }
            }
            guard key.elementsEqual("notification".utf8) || key.elementsEqual("fcm_options".utf8) else {
                return false
            }
            let start = scanner.index
            guard scanner.value(depth: 2) else { return false }
            members.append((key, start..<scanner.index))
            return true
        }
        scanner.skipWhitespace()
        guard ok, scanner.atEnd else { return nil }
        var body: [UInt8] = []
        body.reserveCapacity(payload.count + token.utf8.count + 160)
        body += #"{"message":{"#.utf8
        for member in members {
            body += #"""#.utf8
            body += member.key
            body += #"":"#.utf8
            body += payload[member.value]
            body.append(UInt8(ascii: ","))
        }
        body += #""android":{"#.utf8
        for range in android {
            body += payload[range]
            body.append(UInt8(ascii: ","))
        }
        body += #""priority":""#.utf8
        body += androidPriority.utf8
        body += #"","ttl":""#.utf8
        body += ttl.utf8
        if let collapseKey {
            body += #"","collapse_key":""#.utf8
            body += collapseKey.utf8
        }
        // A notification message's tag: the push id (see ``FCMMessageBuilder/describe``).
        if members.contains(where: { $0.key.elementsEqual("notification".utf8) }) {
            body += #"","notification":{"tag":""#.utf8
            body += pushID.utf8
            body += #""}"#.utf8
            body += #"},"data":{"#.utf8
        } else {
            body += #""},"data":{"#.utf8
        }
        for range in data {
            body += payload[range]
            body.append(UInt8(ascii: ","))
        }
        body += #""push_id":""#.utf8
        body += pushID.utf8
        body += #""},"token":""#.utf8
        body += token.utf8
        body += #""}}"#.utf8
        return body
    }
}
