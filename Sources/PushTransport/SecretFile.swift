#if canImport(Glibc)
import Glibc
private let systemRead = Glibc.read
#elseif canImport(Musl)
import Musl
private let systemRead = Musl.read
#elseif canImport(Darwin)
import Darwin
private let systemRead = Darwin.read
#endif

/// Reads a file that holds or steers secrets (a `.p8` key, the `--config` file) with one descriptor:
/// open (following symlinks, as a Kubernetes Secret volume's `key -> ..data/key` needs), `fstat` that
/// descriptor, check who may read or change it, and read from the same descriptor, so the checked file is
/// the one read.
public enum SecretFile {
    /// Who besides the owner may have access.
    public enum Policy: Sendable {
        /// A private key: nobody else may write it, and others may not read it. The group may read it only
        /// when it is one of this process's own groups (Kubernetes' `fsGroup` makes Secret files 0440).
        case privateKey
        /// A file that steers where secrets go: readable by anyone, writable only by its owner.
        case configuration
    }

    /// The file's bytes, or a sentence that names the file, what is wrong and the command that fixes it.
    ///
    /// With `inside`, the file that was opened (after every symlink) must lie in that directory (after its
    /// own symlinks): a symlink in the directory cannot lead the read out of it. The caller checks the path's
    /// text first, so nothing outside is opened at all.
    public static func read(
        _ path: String,
        policy: Policy,
        maxBytes: Int = 1 << 20,
        inside directory: String? = nil
    ) -> Result<[UInt8], Failure> {
        // O_NONBLOCK: a FIFO or device planted at the path must not hang the open; regular files ignore it.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT { return .failure(.missing) }
            if code == EACCES {
                return .failure(
                    .unreadable(
                        "cannot be read by this process (uid \(geteuid())): chown it to the worker's user, or give its group read access"
                    )
                )
            }
            return .failure(.unreadable("cannot be opened (errno \(code))"))
        }
        defer { close(fd) }
        if let directory {
            guard let opened = Self.openedPath(fd), let root = Self.realPath(directory),
                opened.hasPrefix(root.hasSuffix("/") ? root : root + "/")
            else {
                return .failure(.outside(directory))
            }
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .failure(.unreadable("cannot be inspected (errno \(errno))")) }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            return .failure(.unreadable("is not a regular file"))
        }
        let mode = Int(info.st_mode) & 0o777
        let owner = info.st_uid
        if owner != geteuid() && owner != 0 {
            return .failure(
                .unsafe(
                    "is owned by uid \(owner), neither this process's user (\(geteuid())) nor root: `chown \(geteuid()) \(path)`"
                )
            )
        }
        switch policy {
        case .privateKey:
            if mode & 0o007 != 0 || mode & 0o020 != 0 {
                return .failure(
                    .unsafe(
                        "is readable or writable by other users (mode \(String(mode, radix: 8))): `chmod 600 \(path)` (Kubernetes: defaultMode 0400 on the Secret volume)"
                    )
                )
            }
            if mode & 0o040 != 0 && !Self.isOwnGroup(info.st_gid) {
                return .failure(
                    .unsafe(
                        "is readable by group \(info.st_gid), which this process is not in (mode \(String(mode, radix: 8))): `chmod 600 \(path)`, or run the worker in that group (Kubernetes: fsGroup)"
                    )
                )
            }
        case .configuration:
            if mode & 0o022 != 0 {
                return .failure(
                    .unsafe(
                        "can be changed by other users (mode \(String(mode, radix: 8))), and it decides where payloads and tokens go: `chmod go-w \(path)`"
                    )
                )
            }
        }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { systemRead(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return .failure(.unreadable("could not be read (errno \(errno))"))
            }
            if count == 0 { break }
            bytes += buffer[0..<count]
            if bytes.count > maxBytes {
                return .failure(.unreadable("is larger than \(maxBytes) bytes: is it the right file?"))
            }
        }
        return .success(bytes)
    }

    /// Why a file was not read.
    public enum Failure: Error, Sendable, Equatable {
        /// No such file.
        case missing
        /// It exists but cannot be read; the sentence says why.
        case unreadable(String)
        /// Others may read or change it; the sentence says how to fix it.
        case unsafe(String)
        /// It resolves (through a symlink) to a file outside the directory it must stay in.
        case outside(String)

        /// The sentence, after the file's path.
        public var sentence: String {
            switch self {
            case .missing: "does not exist"
            case .outside(let directory): "leads outside \(directory) (a symlink): put the file itself there"
            case .unreadable(let why), .unsafe(let why): why
            }
        }
    }

    /// The path of the file open at `fd`, as the kernel resolved it.
    private static func openedPath(_ fd: Int32) -> String? {
        #if canImport(Darwin)
        var buffer = [CChar](repeating: 0, count: Int(MAXPATHLEN))
        guard fcntl(fd, F_GETPATH, &buffer) == 0 else { return nil }
        return String(cString: buffer)
        #else
        var buffer = [CChar](repeating: 0, count: 4_096)
        let count = readlink("/proc/self/fd/\(fd)", &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        #endif
    }

    private static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    private static func isOwnGroup(_ gid: gid_t) -> Bool {
        if gid == getegid() { return true }
        let count = getgroups(0, nil)
        guard count > 0 else { return false }
        var groups = [gid_t](repeating: 0, count: Int(count))
        let filled = getgroups(count, &groups)
        return filled > 0 && groups.prefix(Int(filled)).contains(gid)
    }
}
