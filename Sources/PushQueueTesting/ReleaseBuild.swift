import Foundation

/// Whether a release build of `push-worker` is current: built after every file it is built from was last
/// changed (the package's manifests and its targets under `Sources/`: all but the test-support `*Testing`
/// targets and `push-bench`, which `push-worker` does not link). A rebuild whose output is the same binary
/// (an edit to a comment or an import's access level) leaves the binary's date as it was: the tests then run
/// the debug build and say so, the safe side of the doubt.
public enum ReleaseBuild {
    /// Targets under `Sources/` that `push-worker` is not built from.
    static func isInput(target: String) -> Bool { !target.hasSuffix("Testing") && target != "push-bench" }

    /// The push-worker executable the end-to-end tests run, chosen once: `PUSH_WORKER_BINARY` if set (to run a
    /// test against another build, e.g. the one before a change); else the release build (the README's test
    /// command builds it first) when it is newer than every file it is built from, as production runs it and
    /// at a fifth of the debug build's CPU; else the debug build next to the test bundle, which `swift test`
    /// has just built. `release` says whether it is a release build (``HeavyTestGate`` admits fewer heavy
    /// tests at once with the debug one).
    public static let pushWorker: (path: String, release: Bool) = {
        if let other = ProcessInfo.processInfo.environment["PUSH_WORKER_BINARY"], !other.isEmpty {
            return (other, !other.contains("/debug/"))
        }
        let debugDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        let debug = debugDirectory.appendingPathComponent("push-worker").path
        let release = debugDirectory.deletingLastPathComponent().appendingPathComponent("release/push-worker").path
        switch Self.staleness(of: release, packageNear: debugDirectory.path) {
        case nil:
            print("end-to-end tests run the release build \(release)")
            return (release, true)
        case let reason?:
            print(
                "end-to-end tests run the debug build \(debug), with \(HeavyTestGate.debugPermits) heavy tests at once: \(reason) (swift build -c release --product push-worker makes it current)"
            )
            return (debug, false)
        }
    }()

    /// `nil` when `binary` is current; otherwise why not, naming the newer file.
    static func staleness(of binary: String, packageNear start: String) -> String? {
        let files = FileManager.default
        guard let built = Self.modified(binary) else { return "there is no release build" }
        guard let root = Self.packageRoot(above: start) else { return "the package's Package.swift was not found" }
        var inputs = ["Package.swift", "Package.resolved"].map { root + "/" + $0 }
        if let sources = files.enumerator(atPath: root + "/Sources") {
            for case let path as String in sources {
                guard let target = path.split(separator: "/").first, Self.isInput(target: String(target)) else {
                    continue
                }
                inputs.append(root + "/Sources/" + path)
            }
        }
        for input in inputs {
            if let changed = Self.modified(input), changed > built {
                return "\(input.dropFirst(root.count + 1)) changed after the release build"
            }
        }
        return nil
    }

    /// The nearest directory at or above `start` that holds a `Package.swift`.
    static func packageRoot(above start: String) -> String? {
        var directory = URL(fileURLWithPath: start).standardizedFileURL
        while directory.path != "/" {
            if FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) {
                return directory.path
            }
            directory = directory.deletingLastPathComponent()
        }
        return nil
    }

    private static func modified(_ path: String) -> Date? {
        (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date
    }
}
