<?php

// A worker process for the PHP suite: php worker.php MODE ENDPOINTS ARG...
// Prints one line per event; waits for a line on stdin where the test
// decides when it goes on.

declare(strict_types=1);

require __DIR__.'/../autoload.php';
require_once __DIR__.'/../examples/LockManagerService.php';

use Raftlock\Client;
use Raftlock\Examples\LockManagerService;
use Raftlock\Examples\UnacquiredLockException;
use Raftlock\RaftlockException;
use Raftlock\Symfony\RaftlockStore;
use Symfony\Component\Lock\Key;
use Symfony\Component\Lock\Lock;
use Symfony\Component\Lock\LockFactory;

[, $mode, $endpoints] = $argv;
$out = static function (string $line): void {
    fwrite(\STDOUT, $line."\n");
    fflush(\STDOUT);
};

switch ($mode) {
    case 'lock-wait':
    case 'read':
        $key = new Key($argv[3]);
        $lock = (new LockFactory(new RaftlockStore($endpoints)))->createLockFromKey($key);
        $out('WAITING');
        'read' === $mode ? $lock->acquireRead(true) : $lock->acquire(true);
        $out(('read' === $mode ? 'READING' : 'ACQUIRED').' fence '.RaftlockStore::fence($key));
        fgets(\STDIN);
        $lock->release();
        $out('RELEASED');
        break;
    case 'promote':
        // Reads, then (on a line) promotes to a write lock, blocking.
        $key = new Key($argv[3]);
        $lock = (new LockFactory(new RaftlockStore($endpoints)))->createLockFromKey($key);
        $lock->acquireRead(true);
        $out('READING fence '.RaftlockStore::fence($key));
        fgets(\STDIN);
        $out('PROMOTING');
        $lock->acquire(true);
        $out('PROMOTED fence '.RaftlockStore::fence($key));
        fgets(\STDIN);
        $lock->release();
        $out('RELEASED');
        break;
    case 'handoff':
        // The Symfony docs' cross-process example: a Key serialized by
        // another process, continued here.
        $key = unserialize(base64_decode($argv[3]), ['allowed_classes' => [Key::class]]);
        $lock = new Lock($key, new RaftlockStore($endpoints), 300, false);
        $out('ACQUIRED '.var_export($lock->isAcquired(), true));
        $lock->refresh(60);
        $out(sprintf('REFRESHED %.3f', $lock->getRemainingLifetime()));
        $lock->release();
        $out('RELEASED '.var_export($lock->isAcquired(), true));
        break;
    case 'service':
        $service = new LockManagerService(new Client($endpoints), (int) $argv[4]);
        try {
            $service->lock($argv[3], static function (int $fence) use ($out): void {
                $out("LOCKED fence $fence");
                fgets(\STDIN);
            }, 30);
            $out('DONE');
        } catch (UnacquiredLockException $e) {
            $out('UNACQUIRED '.$e->getMessage());
        }
        break;
    case 'hold':
        // A holder at the client's defaults (ttl 30 s): takes ARG, says so,
        // then runs "application code" that makes no client call (it reads
        // stdin) until it is killed or told to release.
        $client = new Client($endpoints);
        $r = $client->lock($argv[3], 30000, 0);
        $out($r['acquired'] ? "HELD session {$r['session_id']}" : 'NOT ACQUIRED');
        fgets(\STDIN);
        $client->unlock($r['session_id']);
        $out('RELEASED');
        break;
    case 'wait':
        // A waiter at the client's defaults (ttl 30 s, no timeout): prints
        // WAITING before it sends its Lock, GRANTED once it holds ARG, then
        // holds it (no client call) until a line on stdin.
        $client = new Client($endpoints);
        $out('WAITING');
        $r = $client->lock($argv[3], 30000, null);
        $out("GRANTED session {$r['session_id']} fence {$r['fence']}");
        fgets(\STDIN);
        $client->unlock($r['session_id']);
        $out('RELEASED');
        break;
    case 'sf-hold':
        // The same holder through Symfony's Lock and RaftlockStore at their
        // defaults, with a Lock ttl of 30 s.
        $lock = (new LockFactory(new RaftlockStore($endpoints)))->createLock($argv[3], 30);
        $out($lock->acquire() ? 'HELD' : 'NOT ACQUIRED');
        fgets(\STDIN);
        $lock->release();
        $out('RELEASED');
        break;
    case 'wait-ttl':
        // A waiter with ttl ARG2 (ms) and end_on_disconnect_ms ARG3, no
        // timeout: prints WAITING before its Lock, then GRANTED with the
        // session, fence and state lock() returned, then holds it (no
        // client call) until a line on stdin.
        $client = new Client($endpoints, null, ['end_on_disconnect_ms' => (int) $argv[5]]);
        $out('WAITING');
        $r = $client->lock($argv[3], (int) $argv[4], null);
        $out("GRANTED session {$r['session_id']} fence {$r['fence']} acquired ".var_export($r['acquired'], true).' state '.$client->state($r['session_id']));
        fgets(\STDIN);
        $client->unlock($r['session_id']);
        $out('RELEASED');
        break;
    case 'revoke':
        // RevokeSession of session ARG at the leader ENDPOINTS (host:port),
        // with plain PHP streams: the node answers once the session's
        // lease has run out, up to its ttl later.
        $ctx = stream_context_create(['http' => ['method' => 'POST', 'header' => "Content-Type: application/json\r\n", 'content' => json_encode(['session_id' => $argv[3]]), 'ignore_errors' => true, 'timeout' => 60]]);
        $out('REVOKED '.@file_get_contents("http://$endpoints/v1/cluster/RevokeSession", false, $ctx));
        break;
    case 'scenario-lock':
        // A lock of client/scenarios.json taken in the background
        // (tests/Scenarios.php): ARG is {name, ttl_ms, timeout_ms (null:
        // no timeout), mode, weight, capacity}. Prints its outcome as one
        // JSON line; once granted it holds the lock, renewing it every
        // third of its ttl (a renewal that answers false is the lost-lock
        // notice, printed once), and answers the lines "keepalive" and
        // "release" on stdin. At the end of stdin it releases and ends.
        $s = json_decode($argv[3], true, 16, \JSON_THROW_ON_ERROR);
        $say = static fn (array $m) => $out(json_encode($m, \JSON_THROW_ON_ERROR | \JSON_UNESCAPED_SLASHES | \JSON_UNESCAPED_UNICODE));
        $error = static fn (\Throwable $e) => ['class' => \get_class($e), 'status' => $e instanceof RaftlockException ? $e->getStatus() : '', 'message' => $e->getMessage(), 'unreachable' => $e instanceof RaftlockException && $e->isUnreachable()];
        $sent = microtime(true);
        try {
            $client = new Client($endpoints);
            $r = $client->lock($s['name'], $s['ttl_ms'], $s['timeout_ms'], $s['mode'], $s['weight'], $s['capacity']);
        } catch (\Throwable $e) {
            $say(['event' => 'outcome', 'outcome' => 'error', 'elapsed_ms' => (int) round((microtime(true) - $sent) * 1000), 'error' => $error($e)]);
            break;
        }
        $elapsed = (int) round((microtime(true) - $sent) * 1000);
        if (!$r['acquired']) {
            $say(['event' => 'outcome', 'outcome' => 'not_acquired', 'elapsed_ms' => $elapsed]);
            break;
        }
        $session = $r['session_id'];
        $say(['event' => 'outcome', 'outcome' => 'granted', 'elapsed_ms' => $elapsed, 'fence' => $r['fence'], 'session_id' => $session, 'ttl_ms' => $r['ttl_ms']]);
        $every = ($r['ttl_ms'] ?: $s['ttl_ms']) / 3000;
        $renewAt = $sent + $every;
        $lost = false;
        $renew = static function () use ($client, $session, &$lost, &$renewAt, $every): void {
            $renewAt = microtime(true) + $every;
            if (!$client->keepAlive($session)) {
                $lost = true;
            }
        };
        while (true) {
            $read = [\STDIN];
            $w = $x = null;
            $left = $lost ? null : max(0.0, $renewAt - microtime(true));
            if (0 === stream_select($read, $w, $x, null === $left ? null : (int) $left, null === $left ? null : (int) (fmod($left, 1.0) * 1e6))) {
                try {
                    $renew();
                    if ($lost) {
                        $say(['event' => 'lost']);
                    }
                } catch (\Throwable $e) {
                    // A renewal that failed: the next one tries again.
                }
                continue;
            }
            $line = fgets(\STDIN);
            if (false === $line) {
                try {
                    $client->unlock($session);
                } catch (\Throwable $e) {
                    // Its ttl ends it then.
                }
                break;
            }
            try {
                switch (trim($line)) {
                    case 'keepalive':
                        $was = $lost;
                        if (!$lost) {
                            $renew();
                        }
                        $say(['event' => 'held', 'held' => !$lost]);
                        if ($lost && !$was) {
                            $say(['event' => 'lost']);
                        }
                        break;
                    case 'release':
                        $say(['event' => 'released', 'released' => $client->unlock($session)]);
                        break 2;
                    default:
                        $say(['event' => 'error', 'error' => ['class' => '', 'status' => '', 'message' => 'unknown command: '.trim($line), 'unreachable' => false]]);
                }
            } catch (\Throwable $e) {
                $say(['event' => 'error', 'error' => $error($e)]);
            }
        }
        break;
    default:
        fwrite(\STDERR, "unknown mode $mode\n");
        exit(2);
}
