<?php

// A stand-in node for the PHP suite: php standin.php MODE. It answers only
// KeepAlive streams (HTTP/1.1, a chunked newline-delimited request body),
// as MODE says, for what a real cluster cannot be made to do on cue (a
// leader that stays connected but answers nothing). It prints "PORT n"
// once listening on loopback, then one line per event: "answer N" (stream
// N's first answer, just before it is sent), "closed N" (the client closed
// stream N). Streams are numbered from 1 in the order they connect; asks
// from 1 on each stream. Modes:
//   silences: stream 1 answers its first ask only, stream 2 nothing,
//             streams 3 and on everything;
//   hangup:   stream 1 answers every ask until a line "silent" comes on
//             stdin, then nothing; when stream 2 connects the stand-in
//             closes stream 1, and every later stream is closed as soon
//             as it connects (so nothing renews);
//   one:      stream 1 answers every ask until a line "silent" comes on
//             stdin, then nothing; streams 2 and on answer everything.

declare(strict_types=1);

$mode = $argv[1] ?? '';
$silent = false; // a line "silent" came on stdin
$answer = match ($mode) {
    'silences' => static fn (int $n, int $k): bool => (1 === $n && 1 === $k) || $n >= 3,
    'hangup' => static function (int $n, int $k) use (&$silent): bool {
        return 1 === $n && !$silent;
    },
    'one' => static function (int $n, int $k) use (&$silent): bool {
        return (1 === $n && !$silent) || $n >= 2;
    },
    default => null,
};
if (null === $answer) {
    fwrite(\STDERR, "standin.php: unknown mode \"$mode\"\n");
    exit(2);
}

$server = stream_socket_server('tcp://127.0.0.1:0', $errno, $errstr);
if (false === $server) {
    fwrite(\STDERR, "standin.php: $errstr\n");
    exit(1);
}
$say = static function (string $line): void {
    fwrite(\STDOUT, $line."\n");
    fflush(\STDOUT);
};
$say('PORT '.substr((string) strrchr(stream_socket_get_name($server, false), ':'), 1));

/** @var array<int, array{sock: resource, n: int, in: string, head: bool, asks: int}> $conns */
$conns = [];
$streams = 0;
$end = static function (int $key) use (&$conns, $say): void {
    fclose($conns[$key]['sock']);
    $say('closed '.$conns[$key]['n']);
    unset($conns[$key]);
};

while (true) {
    $r = [$server, \STDIN];
    foreach ($conns as $c) {
        $r[] = $c['sock'];
    }
    $w = $e = null;
    if (false === stream_select($r, $w, $e, 1)) {
        exit(1);
    }
    foreach ($r as $sock) {
        if (\STDIN === $sock) {
            $line = fgets(\STDIN);
            if (false === $line) {
                exit(0); // the suite ended
            }
            $silent = $silent || 'silent' === trim($line);
            continue;
        }
        if ($sock === $server) {
            $s = stream_socket_accept($server, 0);
            if (false === $s) {
                continue;
            }
            $n = ++$streams;
            if ('hangup' === $mode && $n >= 2) {
                foreach ($conns as $key => $c) {
                    if (1 === $c['n']) {
                        $end($key);
                    }
                }
                fclose($s);
                continue;
            }
            stream_set_blocking($s, false);
            $conns[(int) $s] = ['sock' => $s, 'n' => $n, 'in' => '', 'head' => false, 'asks' => 0];
            continue;
        }
        $key = (int) $sock;
        $data = fread($sock, 65536);
        if (false === $data || ('' === $data && feof($sock))) {
            $end($key);
            continue;
        }
        $c = &$conns[$key];
        $c['in'] .= $data;
        if (!$c['head']) {
            $at = strpos($c['in'], "\r\n\r\n");
            if (false === $at) {
                unset($c);
                continue;
            }
            $c['in'] = substr($c['in'], $at + 4);
            $c['head'] = true;
            fwrite($sock, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n");
        }
        // The chunked body: "size\r\ndata\r\n", newline-delimited asks.
        $body = '';
        while (false !== ($nl = strpos($c['in'], "\r\n"))) {
            $size = hexdec(trim(substr($c['in'], 0, $nl)));
            if (\strlen($c['in']) < $nl + 2 + $size + 2) {
                break;
            }
            $body .= substr($c['in'], $nl + 2, $size);
            $c['in'] = substr($c['in'], $nl + 2 + $size + 2);
        }
        $c['body'] = ($c['body'] ?? '').$body;
        while (false !== ($nl = strpos($c['body'], "\n"))) {
            $ask = json_decode(substr($c['body'], 0, $nl), true);
            $c['body'] = substr($c['body'], $nl + 1);
            $k = ++$c['asks'];
            if (!\is_array($ask) || !$answer($c['n'], $k)) {
                continue;
            }
            if (1 === $k || !isset($c['answered'])) {
                $c['answered'] = true;
                $say('answer '.$c['n']);
            }
            fwrite($sock, json_encode(['session_id' => $ask['session_id'], 'ttl_ms' => '30000', 'ask_id' => $ask['ask_id']])."\n");
        }
        unset($c);
    }
}
