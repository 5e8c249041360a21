"""A minimal PostgreSQL wire-protocol v3 client (simple queries only, trust
authentication), so that the campaign needs only the Python standard
library. Used by the workload processes and by the recovery checks."""

import socket
import struct


class PgError(Exception):
    def __init__(self, fields):
        self.fields = fields
        self.code = fields.get("C", "")
        super().__init__(f"{fields.get('S', 'ERROR')} {self.code}: {fields.get('M', '?')}")


class PgConn:
    def __init__(self, sock_path, user="postgres", database="postgres", timeout=None):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        try:
            self.s.connect(sock_path)
            self.s.sendall(startup_message(user, database))
            self._until_ready()
        except BaseException:
            self.s.close()
            raise

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return bytes(buf)

    def _msg(self):
        t, n = struct.unpack("!ci", self._recv(5))
        return t, self._recv(n - 4)

    @staticmethod
    def _fields(body):
        out = {}
        for part in body.split(b"\0"):
            if part:
                out[chr(part[0])] = part[1:].decode("utf-8", "replace")
        return out

    def _until_ready(self):
        rows, err = [], None
        while True:
            t, body = self._msg()
            if t == b"R":
                code = struct.unpack("!i", body[:4])[0]
                if code != 0:
                    raise PgError({"M": f"authentication method {code} not supported (need trust)"})
            elif t == b"E":
                err = PgError(self._fields(body))
                if not hasattr(self, "_started"):
                    raise err
            elif t == b"D":
                rows.append(data_row(body))
            elif t == b"Z":
                self._started = True
                self.status = body[:1]
                if err is not None:
                    raise err
                return rows
            # 'S', 'K', 'N', 'T', 'C', 'I', 'A': nothing to do.

    def query(self, sql):
        data = sql.encode() + b"\0"
        self.s.sendall(b"Q" + struct.pack("!i", len(data) + 4) + data)
        return self._until_ready()

    def close(self):
        try:
            self.s.sendall(b"X" + struct.pack("!i", 4))
        except OSError:
            pass
        self.s.close()


def startup_message(user, database):
    params = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in
                      (("user", user), ("database", database),
                       ("application_name", "crash_campaign")))
    body = struct.pack("!i", 196608) + params + b"\0"
    return struct.pack("!i", len(body) + 4) + body


def data_row(body):
    """The columns of a DataRow message (text; None for NULL)."""
    ncols = struct.unpack("!h", body[:2])[0]
    pos, row = 2, []
    for _ in range(ncols):
        ln = struct.unpack("!i", body[pos:pos + 4])[0]
        pos += 4
        if ln < 0:
            row.append(None)
        else:
            row.append(body[pos:pos + ln].decode("utf-8", "replace"))
            pos += ln
    return row
