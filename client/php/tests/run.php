<?php

// The PHP suite: `php client/php/tests/run.php [FILTER]` runs every test_*
// function (or those whose name contains FILTER) against a real raftlock
// cluster it starts, with Debian's php-symfony-lock and
// php-symfony-semaphore, and exits non-zero if any fails.

declare(strict_types=1);

namespace Raftlock\Tests;

require __DIR__.'/../autoload.php';
require __DIR__.'/Harness.php';
require __DIR__.'/Scenarios.php';
require_once __DIR__.'/../examples/LockManagerService.php';

use Raftlock\Client;
use Raftlock\Examples\LockManagerService;
use Raftlock\Examples\UnacquiredLockException;
use Raftlock\RaftlockException;
use Raftlock\Symfony\RaftlockSemaphoreStore;
use Raftlock\Symfony\RaftlockStore;
use Symfony\Component\Lock\Exception\InvalidTtlException;
use Symfony\Component\Lock\Exception\LockAcquiringException;
use Symfony\Component\Lock\Exception\LockConflictedException;
use Symfony\Component\Lock\Key;
use Symfony\Component\Lock\Lock;
use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Semaphore\Exception\RuntimeException as SemaphoreRuntimeException;
use Symfony\Component\Semaphore\Exception\SemaphoreExpiredException;
use Symfony\Component\Semaphore\SemaphoreFactory;

/** A lock name no other test (or run) uses. */
function name(string $what): string
{
    return "php-test/$what/".bin2hex(random_bytes(4));
}

/** @return array{holders: list<array>, waiters: list<array>} */
function queue(Client $c, string $name): array
{
    $d = $c->describe($name);

    return ['holders' => $d['info']['holders'] ?? [], 'waiters' => $d['info']['waiters'] ?? []];
}

// ---- Symfony Lock: the examples of Symfony's documentation ----

function test_non_blocking_acquire(Cluster $cl): void
{
    $factory = new LockFactory(new RaftlockStore($cl->endpoints()));
    $name = name('pdf');
    $lock = $factory->createLock($name);
    check($lock->acquire(), 'the first acquire()');
    $other = $factory->createLock($name);
    check(!$other->acquire(), 'a second Lock on the resource while it is held');
    check($lock->isAcquired(), 'isAcquired() of the holder');
    check(!$other->isAcquired(), 'isAcquired() of the other');
    // Symfony's pitfall: acquire() twice on one Lock answers true.
    check($lock->acquire(), 'acquire() again on the holding Lock');
    checkSame(1, \count(queue(new Client($cl->endpoints()), $name)['holders']), 'holders after acquiring twice');
    $lock->release();
    check(!$lock->isAcquired(), 'isAcquired() after release()');
    check($other->acquire(), 'the other Lock after the release');
    $other->release();
    checkSame([], queue(new Client($cl->endpoints()), $name)['holders'], 'holders after both released');
}

function test_blocking_acquire_is_granted_on_release(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c));
    $name = name('blocking');
    $key = new Key($name);
    $lock = $factory->createLockFromKey($key);
    check($lock->acquire(), 'the holder');
    $held = RaftlockStore::fence($key);
    // acquire(true) waits in the node's queue (waitAndSave), not in a
    // polling loop: the queue shows it.
    $w = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $w->expect('WAITING');
    eventually(10, 'the worker queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    // A second waiter killed while it waits leaves nothing queued.
    $doomed = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $doomed->expect('WAITING');
    eventually(10, 'the second worker queued', fn () => 2 === \count(queue($c, $name)['waiters']));
    $doomed->kill();
    eventually(10, "the killed worker's wait withdrawn", fn () => 1 === \count(queue($c, $name)['waiters']));
    $lock->release();
    $line = $w->expect('ACQUIRED fence ');
    $fence = (int) substr($line, \strlen('ACQUIRED fence '));
    check($fence > $held, "the waiter's fence $fence is larger than the holder's $held");
    $w->send('go');
    $w->expect('RELEASED');
    checkSame(['holders' => [], 'waiters' => []], queue($c, $name), 'the queue at the end');
}

function test_a_wait_withdrawn_under_it_waits_again(Cluster $cl): void
{
    // The node ends the session a blocking acquire waits in (here an
    // Unlock from elsewhere; in life, when an earlier attempt's connection
    // closed): the store waits again, in a new session.
    $c = new Client($cl->endpoints());
    $name = name('rewait');
    $lock = (new LockFactory(new RaftlockStore($c)))->createLock($name);
    check($lock->acquire(), 'the holder');
    $w = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $w->expect('WAITING');
    $first = 0;
    eventually(10, 'the worker queued', function () use ($c, $name, &$first) {
        $waiters = queue($c, $name)['waiters'];
        $first = (int) ($waiters[0]['session_id'] ?? 0);

        return 1 === \count($waiters);
    });
    checkSame(0, $c->unlock($first), 'grants released by ending the waiting session');
    eventually(10, 'the worker queued again, in a new session', function () use ($c, $name, $first) {
        $waiters = queue($c, $name)['waiters'];

        return 1 === \count($waiters) && (int) $waiters[0]['session_id'] !== $first;
    });
    $lock->release();
    $w->expect('ACQUIRED fence ');
    $w->send('done');
    $w->expect('RELEASED');
}

function test_readers_share_while_a_writer_waits(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('report');
    $readers = [];
    foreach (range(1, 3) as $i) {
        $r = new Worker(['read', $cl->endpoints(), $name]);
        $r->expect('WAITING');
        $r->expect('READING fence ');
        $readers[] = $r;
    }
    checkSame(3, \count(queue($c, $name)['holders']), 'readers holding together');
    $writer = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $writer->expect('WAITING');
    eventually(10, 'the writer queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    // A reader arriving now queues behind the writer (no barging).
    $late = new Worker(['read', $cl->endpoints(), $name]);
    $late->expect('WAITING');
    eventually(10, 'the late reader queued', fn () => 2 === \count(queue($c, $name)['waiters']));
    foreach ($readers as $i => $r) {
        $r->send('done');
        $r->expect('RELEASED');
        if ($i < 2) {
            $q = queue($c, $name);
            checkSame([2 - $i, 2], [\count($q['holders']), \count($q['waiters'])], 'holders and waiters before the last reader releases');
        }
    }
    $writer->expect('ACQUIRED fence ');
    checkSame(1, \count(queue($c, $name)['waiters']), 'the late reader waits for the writer');
    $writer->send('done');
    $writer->expect('RELEASED');
    $late->expect('READING fence ');
    $late->send('done');
    $late->expect('RELEASED');
}

function test_serialized_key_released_by_another_process(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $store = new RaftlockStore($c);
    $name = name('handoff');
    $key = new Key($name);
    $lock = new Lock($key, $store, 300, false);
    check($lock->acquire(), 'acquire in the first process');
    $fence = RaftlockStore::fence($key);
    $w = new Worker(['handoff', $cl->endpoints(), base64_encode(serialize($key))]);
    $w->expect('ACQUIRED true');
    // The second process's refresh() uses the session's next seq, carried
    // by the key: a SetSessionTtl (60 s differs from the 300 s session).
    check(1 === preg_match('/^REFRESHED 5[0-4]$/', $w->expect('REFRESHED ')), 'the remaining lifetime after refresh(60) in the second process');
    $w->expect('RELEASED false');
    check(!$c->checkFence($name, $fence), 'the fence is no longer current');
    $third = (new LockFactory($store))->createLock($name);
    check($third->acquire(), 'a third party after the release');
    $third->release();
}

function test_refresh_keeps_an_expiring_lock_and_its_loss_is_seen(Cluster $cl): void
{
    $factory = new LockFactory(new RaftlockStore($cl->endpoints()));
    $name = name('refresh');
    $lock = $factory->createLock($name, 2);
    check($lock->acquire(), 'acquire with a 2 s ttl');
    $left = $lock->getRemainingLifetime();
    check($left > 1.5 && $left <= 1.8, "remaining lifetime $left s: 2 s less the 10 % margin, from the send");
    $until = microtime(true) + 4;
    while (microtime(true) < $until) {
        usleep(500000); // the work of one item
        $lock->refresh();
    }
    check($lock->isAcquired(), 'held 4 s with a 2 s ttl, refreshed every item');
    $lock->refresh(5);
    $left = $lock->getRemainingLifetime();
    check($left > 4 && $left <= 4.5, "remaining lifetime $left s after refresh(5)");
    $lock->refresh(2);
    // Not refreshed any more: the session expires and another takes it.
    $other = $factory->createLock($name, 10);
    eventually(10, 'the unrefreshed lock to expire', fn () => $other->acquire());
    check(!$lock->isAcquired(), 'isAcquired() after the expiry');
    check($lock->isExpired(), 'isExpired() after the expiry');
    checkThrows(LockConflictedException::class, 'lost', fn () => $lock->refresh());
    $other->release();
}

function test_lock_without_ttl_lives_the_stores_initial_ttl(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c, null, 1.0));
    $name = name('no-ttl');
    $lock = $factory->createLock($name, null);
    check($lock->acquire(), 'acquire');
    $left = $lock->getRemainingLifetime();
    check(null !== $left && $left <= 0.9, "remaining lifetime $left s: the initial 1 s ttl less the margin");
    eventually(10, 'the session to expire after its initial ttl', fn () => !$lock->isAcquired());
}

function test_promotion_upgrades_in_place_ahead_of_a_waiting_writer(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c));
    $name = name('promote');
    $key = new Key($name);
    $lock = $factory->createLockFromKey($key);
    check($lock->acquireRead(), 'acquireRead');
    $read = RaftlockStore::fence($key);
    $session = (int) queue($c, $name)['holders'][0]['session_id'];
    // A writer queues behind the read. Releasing the read and locking
    // anew would hand the lock to it; an upgrade goes first.
    $w = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $w->expect('WAITING');
    eventually(10, 'the writer queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    check($lock->acquire(), 'acquire (promotion) with a writer queued');
    $write = RaftlockStore::fence($key);
    check($write > $read, "the upgrade's fence $write is larger than the read's $read");
    $q = queue($c, $name);
    checkSame([[(string) $session, (string) $write, 'MODE_EXCLUSIVE']], array_map(fn ($h) => [$h['session_id'], $h['fence'], $h['mode'] ?? 'MODE_EXCLUSIVE'], $q['holders']), 'holders after the promotion: the same session');
    checkSame(1, \count($q['waiters']), 'the writer still waits');
    // Demotion keeps the fence, in the same session.
    check($lock->acquireRead(), 'acquireRead (demotion)');
    checkSame($write, RaftlockStore::fence($key), 'the fence after the demotion');
    checkSame(['MODE_SHARED'], array_map(fn ($h) => $h['mode'] ?? 'MODE_EXCLUSIVE', queue($c, $name)['holders']), 'holders after the demotion');
    $lock->release();
    $line = $w->expect('ACQUIRED fence ');
    check((int) substr($line, \strlen('ACQUIRED fence ')) > $write, 'the writer comes after the upgraded grant');
    $w->send('go');
    $w->expect('RELEASED');
}

function test_a_second_reader_promoting_is_refused_and_keeps_its_read(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('promote2');
    $p = new Worker(['promote', $cl->endpoints(), $name]);
    $p->expect('READING fence ');
    $key = new Key($name);
    $lock = (new LockFactory(new RaftlockStore($c)))->createLockFromKey($key);
    check($lock->acquireRead(), 'a second reader');
    check(!$lock->acquire(), 'a non-blocking promotion beside another reader');
    checkSame(2, \count(queue($c, $name)['holders']), 'both reads still held');
    // The worker's blocking promotion waits for this read.
    $p->send('go');
    $p->expect('PROMOTING');
    eventually(10, "the worker's upgrade waiting", fn () => 1 === \count(queue($c, $name)['waiters']));
    $threw = null;
    try {
        $lock->acquire(true);
    } catch (LockConflictedException $e) {
        $threw = $e;
    }
    check(null !== $threw && str_contains($threw->getMessage(), 'another reader is promoting'), 'a second blocking promotion is refused');
    checkSame(2, \count(queue($c, $name)['holders']), 'both reads still held after the refusal');
    $lock->release();
    $line = $p->expect('PROMOTED fence ');
    checkSame(['MODE_EXCLUSIVE'], array_map(fn ($h) => $h['mode'] ?? 'MODE_EXCLUSIVE', queue($c, $name)['holders']), 'the worker holds it exclusively');
    $p->send('go');
    $p->expect('RELEASED');
}

function test_client_lock_all_is_all_or_nothing(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $a = name('all-a');
    $b = name('all-b');
    $r = $c->lockAll([$b => Client::EXCLUSIVE, $a => Client::SHARED], 10000);
    check($r['acquired'], 'lockAll of two free names');
    checkSame([$b, $a], array_column($r['grants'], 'name'), 'grants in the order asked');
    checkSame([Client::EXCLUSIVE, Client::SHARED], array_column($r['grants'], 'mode'), 'the modes');
    checkSame($r['grants'][0]['fence'] + 1, $r['grants'][1]['fence'], 'consecutive fences: one write');
    checkSame((string) $r['session_id'], queue($c, $a)['holders'][0]['session_id'], "a's holder");
    // Another request over a held name takes nothing, queues nothing.
    $c2 = name('all-c');
    $no = $c->lockAll([$c2 => Client::EXCLUSIVE, $b => Client::SHARED], 10000);
    check(!$no['acquired'] && 0 === $no['session_id'], 'lockAll over a held name');
    $t = microtime(true);
    $no = $c->lockAll([$c2 => Client::EXCLUSIVE, $b => Client::SHARED], 10000, 300);
    check(!$no['acquired'] && microtime(true) - $t >= 0.3, 'a bounded lockAll gives up after its timeout');
    checkSame(['holders' => [], 'waiters' => []], queue($c, $c2), 'nothing left on the free name');
    checkSame(0, \count(queue($c, $b)['waiters']), 'nothing queued on the held name');
    checkSame(2, $c->unlock($r['session_id']), 'unlock releases both');
    // Bad input is refused before anything is sent.
    $many = [];
    for ($i = 0; $i <= Client::MAX_NAMES_PER_LOCK_ALL; ++$i) {
        $many[name("many-$i")] = Client::EXCLUSIVE;
    }
    foreach ([[[], 10000, 0], [$many, 10000, 0], [[$a => 'MODE_SEMAPHORE'], 10000, 0], [['' => Client::EXCLUSIVE], 10000, 0],
              [[$a => Client::EXCLUSIVE], 10000, 10000], [[$a => Client::EXCLUSIVE], 10000, -1], [[$a => Client::EXCLUSIVE], 999, 0]] as [$locks, $ttl, $timeout]) {
        $threw = false;
        try {
            $c->lockAll($locks, $ttl, $timeout);
        } catch (\InvalidArgumentException $e) {
            $threw = true;
        }
        check($threw, 'bad lockAll input refused: '.\count($locks)." names, ttl $ttl, timeout $timeout");
    }
    checkSame(['holders' => [], 'waiters' => []], queue($c, $a), 'nothing taken by the refused requests');
    // Exactly the limit is granted.
    array_pop($many);
    $r = $c->lockAll($many, 10000);
    check($r['acquired'] && Client::MAX_NAMES_PER_LOCK_ALL === \count($r['grants']), 'lockAll of 64 names');
    checkSame(64, $c->unlock($r['session_id']), 'unlock releases all 64');
}

function test_client_upgrade_and_downgrade(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('upgrade');
    $r1 = $c->lock($name, 10000, 0, Client::SHARED);
    $r2 = $c->lock($name, 10000, 0, Client::SHARED);
    check($r1['acquired'] && $r2['acquired'], 'two readers');
    $u = $c->upgrade($r1['session_id'], $r1['next_seq'], $name, $r1['fence'], 0);
    check(!$u['acquired'], 'a try upgrade beside another reader');
    $t = microtime(true);
    $u = $c->upgrade($r1['session_id'], $r1['next_seq'] + 1, $name, $r1['fence'], 300);
    check(!$u['acquired'] && microtime(true) - $t >= 0.3, 'a bounded upgrade gives up after its timeout');
    checkSame(2, \count(queue($c, $name)['holders']), 'both reads still held');
    $threw = null;
    try {
        $c->upgrade($r1['session_id'], $r1['next_seq'] + 2, $name, $r1['fence'] + 1000, 0);
    } catch (RaftlockException $e) {
        $threw = $e->getStatus();
    }
    checkSame('FAILED_PRECONDITION', $threw, 'an upgrade of a grant not held');
    checkSame(1, $c->unlock($r2['session_id']), 'the other reader leaves');
    $u = $c->upgrade($r1['session_id'], $r1['next_seq'] + 3, $name, $r1['fence'], 0);
    check($u['acquired'] && $u['fence'] > $r2['fence'], 'the lone reader upgrades, to a new fence');
    checkSame([[$u['fence'], 'MODE_EXCLUSIVE']], array_map(fn ($h) => [(int) $h['fence'], $h['mode'] ?? 'MODE_EXCLUSIVE'], queue($c, $name)['holders']), 'holders after the upgrade');
    checkSame($u['fence'], $c->downgrade($r1['session_id'], $r1['next_seq'] + 4, $name, $u['fence']), 'the downgrade keeps the fence');
    checkSame(['MODE_SHARED'], array_map(fn ($h) => $h['mode'] ?? 'MODE_EXCLUSIVE', queue($c, $name)['holders']), 'holders after the downgrade');
    $threw = null;
    try {
        $c->downgrade($r1['session_id'], $r1['next_seq'] + 5, $name, $u['fence']);
    } catch (RaftlockException $e) {
        $threw = $e->getStatus();
    }
    checkSame('FAILED_PRECONDITION', $threw, 'a downgrade of a shared grant');
    checkSame(1, $c->unlock($r1['session_id']), 'unlock');
}

// ---- Symfony Semaphore ----

function test_weighted_semaphore(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new SemaphoreFactory(new RaftlockSemaphoreStore($c));
    $name = name('thumbs');
    $big = [];
    foreach (range(1, 4) as $i) {
        $s = $factory->createSemaphore($name, 10, 2); // images over 3840 px weigh 2
        check($s->acquire(), "weight-2 semaphore $i");
        $big[] = $s;
    }
    $small = [];
    foreach (range(1, 2) as $i) {
        $s = $factory->createSemaphore($name, 10, 1);
        check($s->acquire(), "weight-1 semaphore $i");
        $small[] = $s;
    }
    $heavy = $factory->createSemaphore($name, 10, 2);
    check(!$heavy->acquire(), 'weight 2 at 10/10');
    $small[0]->release();
    check(!$heavy->acquire(), 'weight 2 at 9/10');
    $small[1]->release();
    check($heavy->acquire(), 'weight 2 at 8/10');
    check($heavy->isAcquired(), 'isAcquired');
    $heavy->refresh(30);
    check($heavy->isAcquired(), 'isAcquired after refresh(30)');
    // Another limit for the same name is refused while permits are held.
    $e = checkThrows(SemaphoreRuntimeException::class, 'Failed to acquire', fn () => $factory->createSemaphore($name, 5)->acquire());
    checkThrows(RaftlockException::class, 'capacity', function () use ($e) {
        throw $e;
    });
    foreach (array_merge($big, [$heavy]) as $s) {
        $s->release();
    }
    checkSame([], queue($c, $name)['holders'], 'holders after every release');
}

function test_semaphore_expiry_is_reported(Cluster $cl): void
{
    $factory = new SemaphoreFactory(new RaftlockSemaphoreStore($cl->endpoints()));
    $name = name('sem-expiry');
    $s = $factory->createSemaphore($name, 1, 1, 1.0);
    check($s->acquire(), 'acquire with a 1 s ttl');
    $other = $factory->createSemaphore($name, 1, 1, 10.0);
    eventually(10, 'the unrefreshed permit to expire', fn () => $other->acquire());
    check(!$s->isAcquired(), 'isAcquired after the expiry');
    checkThrows(SemaphoreExpiredException::class, 'session ended', fn () => $s->refresh());
    $other->release();
}

// ---- summit-api's LockManagerService, over the one-call Lock ----

function test_lock_manager_service(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('tickets');
    $a = new Worker(['service', $cl->endpoints(), $name, '20000']);
    $first = (int) substr($a->expect('LOCKED fence '), 13);
    $b = new Worker(['service', $cl->endpoints(), $name, '20000']);
    eventually(10, 'b queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    // A worker killed while it waits leaves nothing queued.
    $dead = new Worker(['service', $cl->endpoints(), $name, '20000']);
    eventually(10, 'the doomed worker queued', fn () => 2 === \count(queue($c, $name)['waiters']));
    $dead->kill();
    eventually(10, "the killed worker's wait withdrawn", fn () => 1 === \count(queue($c, $name)['waiters']));
    $a->send('done');
    $a->expect('DONE');
    $second = (int) substr($b->expect('LOCKED fence '), 13);
    check($second > $first, "fences grow: $first then $second");
    // While b holds it, a short wait gives up cleanly and leaves nothing.
    $service = new LockManagerService($c, 300);
    checkThrows(UnacquiredLockException::class, 'not acquired within 300 ms', fn () => $service->acquireLock($name, 30));
    checkSame(0, \count(queue($c, $name)['waiters']), 'waiters after the timed-out wait');
    $b->send('done');
    $b->expect('DONE');
    checkSame(42, $service->lock($name, fn (int $fence) => $fence > $second ? 42 : 0, 30), 'lock() runs the closure with a larger fence');
    checkSame([], queue($c, $name)['holders'], 'holders after lock() returned');
}

// ---- the client: leaders, failures, limits, credentials ----

function test_follows_the_leader_past_dead_nodes_and_followers(Cluster $cl): void
{
    $leader = $cl->leader();
    $followers = array_values(array_filter($cl->nodes, fn ($a) => $a !== $leader));
    $dead = @stream_socket_server('tcp://127.0.0.1:0');
    $deadAddr = stream_socket_get_name($dead, false);
    fclose($dead);
    $store = new RaftlockStore("http://$deadAddr,".implode(',', $followers));
    $lock = (new LockFactory($store))->createLock(name('follow'));
    check($lock->acquire(), 'acquire through a dead node and followers');
    $lock->release();
}

// Nodes that refuse the connection or whose names do not resolve cannot
// have taken the request: the client gives up at once (every endpoint
// three rounds in a row), as every raftlock client does, rather than
// retrying for its 15 s (the seed-user walk of 2026-11-29 waited it out).
function test_no_node_answering_gives_up_naming_the_nodes(Cluster $cl): void
{
    $dead = @stream_socket_server('tcp://127.0.0.1:0');
    $deadAddr = stream_socket_get_name($dead, false);
    fclose($dead);
    $c = new Client("$deadAddr,no-such-host.invalid:7101");
    $started = microtime(true);
    $e = checkThrows(RaftlockException::class, "no node accepts connections (each refused or did not resolve every attempt): http://$deadAddr: connection refused; http://no-such-host.invalid:7101: the name does not resolve (", fn () => $c->lock(name('down'), 10000));
    $took = microtime(true) - $started;
    check($took < 12.0, "gave up after $took s, not at once");
    checkSame('UNAVAILABLE', $e->getStatus(), 'status');
    check($e->isUnreachable(), 'nothing was sent: isUnreachable()');
    // A node's own UNAVAILABLE (no leader) is not.
    check(!(new RaftlockException('UNAVAILABLE', 'no leader', 503))->isUnreachable(), 'an answer is not unreachable');
    $lock = (new LockFactory(new RaftlockStore($c)))->createLock(name('down'));
    checkThrows(LockAcquiringException::class, 'Failed to acquire', fn () => $lock->acquire());
}

function test_bad_input_is_refused_clearly(Cluster $cl): void
{
    foreach (['', ' , ', 'ftp://127.0.0.1:1', '127.0.0.1', 'http://127.0.0.1:1/path'] as $eps) {
        checkThrows(\InvalidArgumentException::class, 'raftlock', fn () => new Client($eps));
    }
    checkThrows(\InvalidArgumentException::class, 'unknown options', fn () => new Client('127.0.0.1:1', null, ['retry' => 1]));
    // The ttl limits, at their edges (Client::MIN_TTL_MS, MAX_TTL_MS).
    new RaftlockStore('127.0.0.1:1', null, 1.0);
    new RaftlockStore('127.0.0.1:1', null, 3600.0);
    checkThrows(InvalidTtlException::class, '1 to 3600 seconds', fn () => new RaftlockStore('127.0.0.1:1', null, 0.999));
    checkThrows(InvalidTtlException::class, '1 to 3600 seconds', fn () => new RaftlockStore('127.0.0.1:1', null, 3600.001));
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c));
    $lock = $factory->createLock(name('ttl'), 0.5);
    checkThrows(InvalidTtlException::class, '1 to 3600 seconds', fn () => $lock->acquire());
    // Client::MAX_NAME_BYTES, at its edge.
    $prefix = 'php-test/';
    $longest = $prefix.str_repeat('n', Client::MAX_NAME_BYTES - \strlen($prefix));
    $r = $c->lock($longest, 1000, 0);
    check($r['acquired'], 'a name of MAX_NAME_BYTES');
    $c->unlock($r['session_id']);
    checkThrows(\InvalidArgumentException::class, 'bytes of UTF-8', fn () => $c->lock($longest.'n', 1000));
    checkThrows(\InvalidArgumentException::class, 'bytes of UTF-8', fn () => $c->lock("php-test/\xff", 1000));
    checkThrows(LockAcquiringException::class, 'Failed to acquire', fn () => $factory->createLock($longest.'n')->acquire());
    checkThrows(\InvalidArgumentException::class, 'negative', fn () => $c->lock(name('neg'), 1000, -1));
    // The node's own refusal comes back with its code and HTTP status.
    $e = checkThrows(RaftlockException::class, 'capacity', fn () => $c->lock(name('cap'), 1000, 0, Client::SEMAPHORE, 1, Client::MAX_CAPACITY + 1));
    checkSame(['INVALID_ARGUMENT', 400], [$e->getStatus(), $e->getHttpStatus()], 'status of a capacity past the limit');
    $sem = (new SemaphoreFactory(new RaftlockSemaphoreStore($c)))->createSemaphore(name('cap'), Client::MAX_CAPACITY, Client::MAX_CAPACITY);
    check($sem->acquire(), 'a semaphore of MAX_CAPACITY');
    $sem->release();
    checkThrows(SemaphoreRuntimeException::class, 'Failed to acquire', fn () => (new SemaphoreFactory(new RaftlockSemaphoreStore($c)))->createSemaphore(name('cap'), Client::MAX_CAPACITY + 1)->acquire());
    checkSame(0, $c->unlock(987654321), 'unlock of an unknown session');
}

function test_token(Cluster $unused): void
{
    $acl = tempnam(sys_get_temp_dir(), 'raftlock-acl-');
    file_put_contents($acl, <<<'TOML'
        peer_token = "php-suite-peer-token-0123456789"
        [[token]]
        identity = "app"
        token = "app-token"
        [[rule]]
        identity = "app"
        allow = "lock"
        prefix = "app/"
        TOML);
    $cl = new Cluster(['--acl-file', $acl]);
    try {
        $lock = (new LockFactory(new RaftlockStore($cl->endpoints(), 'app-token')))->createLock('app/'.bin2hex(random_bytes(4)));
        check($lock->acquire(), 'acquire with the token');
        $lock->release();
        $e = checkThrows(RaftlockException::class, 'UNAUTHENTICATED', fn () => (new LockFactory(new RaftlockStore($cl->endpoints())))->createLock('app/x')->acquire());
        checkSame(401, $e->getHttpStatus(), 'HTTP status without a token');
        $e = checkThrows(RaftlockException::class, 'PERMISSION_DENIED', fn () => (new Client($cl->endpoints(), 'app-token'))->lock('other/x', 1000));
        checkSame(403, $e->getHttpStatus(), 'HTTP status outside the rule');
    } finally {
        $cl->stop();
        unlink($acl);
    }
}

// ---- the README ----

/** The fenced blocks of client/php/README.md in LANG, in order. */
function readmeBlocks(string $lang): array
{
    preg_match_all('/^```'.$lang.'\n(.*?)^```$/ms', file_get_contents(__DIR__.'/../README.md'), $m);

    return $m[1];
}

/**
 * Runs $script in a PHP process of its own; its exit status and its output lines.
 *
 * @return array{0: int, 1: list<string>}
 */
function runPhp(string $script): array
{
    $file = tempnam(sys_get_temp_dir(), 'raftlock-readme-');
    file_put_contents($file, $script);
    try {
        exec(escapeshellarg(\PHP_BINARY).' '.escapeshellarg($file).' 2>&1', $out, $status);
    } finally {
        unlink($file);
    }

    return [$status, $out];
}

// The README's "Install and a first lock" is under ten lines, and it and
// the Client example run as written (in a process of their own, against
// this cluster), take their locks and give them back.
function test_readme_first_lock_and_client_example(Cluster $cl): void
{
    [$install] = readmeBlocks('sh');
    $php = readmeBlocks('php');
    $lines = fn (string $b) => \count(array_filter(explode("\n", $b), fn ($l) => '' !== trim($l)));
    check($lines($install) + $lines($php[0]) < 10, 'install and first lock in under ten lines: '.($lines($install) + $lines($php[0])));
    $client = array_values(array_filter($php, fn ($b) => str_contains($b, 'new Raftlock\Client(')))[0];
    $lockAll = array_values(array_filter($php, fn ($b) => str_contains($b, '->lockAll(')))[0];
    $script = "<?php\nfunction work(\$fence) { echo 'work ', json_encode(\$fence, JSON_UNESCAPED_SLASHES), \"\\n\"; }\n".$php[0].$client.$lockAll;
    $script = str_replace("'/path/to/raftlock/client/php/autoload.php'", var_export(\dirname(__DIR__).'/autoload.php', true), $script);
    $script = str_replace('/* work */', 'echo "locked\n";', $script);
    $script = preg_replace("/'http:\\/\\/10\\.0\\.0\\.[^']*'/", var_export($cl->endpoints(), true), $script, -1, $endpoints);
    checkSame(2, $endpoints, 'endpoint lists replaced');
    [$status, $out] = runPhp($script);
    checkSame(0, $status, 'exit status of the README example ('.implode(' | ', $out).')');
    checkSame('locked', $out[0] ?? null, 'the first lock held');
    check(1 === preg_match('/^work [1-9][0-9]*$/', $out[1] ?? ''), 'the Client example worked under a fence: '.implode(' | ', $out));
    check(1 === preg_match('#^work \{"order/17":([1-9][0-9]*),"stock/42":([1-9][0-9]*)\}$#', $out[2] ?? '', $m) && (int) $m[2] === (int) $m[1] + 1,
        'the lockAll example worked under two consecutive fences: '.implode(' | ', $out));
    $c = new Client($cl->endpoints());
    checkSame(['holders' => [], 'waiters' => []], queue($c, 'order/17'), 'order/17 after the example');
    checkSame(['holders' => [], 'waiters' => []], queue($c, 'invoice-42'), 'invoice-42 after the example');
    checkSame(['holders' => [], 'waiters' => []], queue($c, 'tickets/42'), 'tickets/42 after the example');
}

// The README's fence-from-a-Key block (indented under its bullet) runs as
// written, after a $store of this cluster, and reads an int fence.
function test_readme_fence_from_a_key(Cluster $cl): void
{
    preg_match_all('/^  ```php\n(.*?)^  ```$/ms', file_get_contents(__DIR__.'/../README.md'), $m);
    $blocks = array_values(array_filter($m[1], fn ($b) => str_contains($b, 'createLockFromKey(')));
    checkSame(1, \count($blocks), 'the README shows one createLockFromKey block');
    $block = preg_replace('/^  /m', '', $blocks[0]);
    $script = "<?php\nrequire ".var_export(\dirname(__DIR__).'/autoload.php', true).";\n"
        .'$store = new Raftlock\Symfony\RaftlockStore('.var_export($cl->endpoints(), true).");\n"
        .$block
        .'echo json_encode($fence), "\n"; $lock->release();'."\n";
    [$status, $out] = runPhp($script);
    checkSame(0, $status, 'exit status of the README block ('.implode(' | ', $out).')');
    check(1 === preg_match('/^[1-9][0-9]*$/', $out[0] ?? ''), 'an int fence: '.implode(' | ', $out));
    checkSame(['holders' => [], 'waiters' => []], queue(new Client($cl->endpoints()), 'invoice-42'), 'invoice-42 after the block');
}

// ---- client/scenarios.json, as client/scenarios.md says ----

// Every scenario of the file the four clients share, in order, against a
// cluster of its own: three `raftlockd run` processes (kill_leader kills
// one of them).
function test_scenarios(Cluster $unused): void
{
    $nodes = new NodeProcesses();
    try {
        (new ScenarioRunner($nodes))->runFile(\dirname(__DIR__, 2).'/scenarios.json', function (string $name, float $took): void {
            printf("     scenario %s (%.2f s)\n", $name, $took);
        });
    } finally {
        $nodes->stop();
    }
}

// ---- the runner ----

$filter = $argv[1] ?? '';
$tests = array_values(array_filter(get_defined_functions()['user'], fn ($f) => str_starts_with($f, 'raftlock\\tests\\test_') && str_contains($f, $filter)));
$started = microtime(true);
$cluster = new Cluster();
$failed = [];
foreach ($tests as $test) {
    $short = substr($test, \strlen('raftlock\\tests\\'));
    $t = microtime(true);
    try {
        $test($cluster);
        printf("ok   %s (%.2f s)\n", $short, microtime(true) - $t);
    } catch (\Throwable $e) {
        $failed[] = $short;
        printf("FAIL %s (%.2f s): %s\n", $short, microtime(true) - $t, $e->getMessage());
        for ($p = $e->getPrevious(); null !== $p; $p = $p->getPrevious()) {
            printf("     caused by %s: %s\n", \get_class($p), $p->getMessage());
        }
        printf("     at %s:%d\n", $e->getFile(), $e->getLine());
    }
    gc_collect_cycles(); // end the workers of a test before the next
}
$cluster->stop();
printf("%d tests, %d failed, %.1f s\n", \count($tests), \count($failed), microtime(true) - $started);
exit($failed ? 1 : 0);
