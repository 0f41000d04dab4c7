'use strict';
// livecov hook for Node.js. Loaded into a program with
//
//     NODE_OPTIONS="--require /path/to/livecov-hook.cjs"
//
// it makes the process a livecov instance like the native agents: V8's
// precise block coverage, read in-process through node:inspector, is served
// as LCOV on $LIVECOV_DIR/sockets/<instance>.sock (and TCP if
// LIVECOV_LISTEN is set) and written to $LIVECOV_DIR/reports/ periodically,
// at exit and on SIGTERM/SIGINT. Preloaded into worker threads too, it
// sends each worker's counts to the main thread, whose report is the whole
// process's (see "worker threads" below). No npm dependency: it is copied
// into images as one file. It does nothing unless LIVECOV_DIR or LIVECOV_LISTEN is set,
// and it never throws into the program: a failure is one line on stderr
// starting with "livecov:".
//
// Line, function and branch counts follow c8 / v8-to-istanbul, so that the
// same run reports the same covered lines with either tool: a line's count is
// that of the innermost V8 range that contains the whole line.

const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const { fileURLToPath } = require('node:url');
const { findSourceMap } = require('node:module');

const LIVECOV_VERSION = '0.1.0';
const RUNTIME = 'node';

/** What no report wants by default: the same as the native agents' default. */
const DEFAULT_IGNORE =
  '/rustc/|/\\.cargo/registry/|/\\.cargo/git/|^/usr/include/|^/usr/lib/|/node_modules/|/site-packages/';

const LIMITS = {
  maxHeaderBytes: 16 * 1024,
  maxHeaders: 64,
  maxBodyBytes: 64 * 1024,
  maxConnections: 256,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 120_000,
  idleTimeoutMs: 30_000,
  // How long a report waits for worker threads' counts: on the event loop, and at exit (where the process waits).
  workerAnswerMs: 10_000,
  workerAnswerAtExitMs: 2_000,
};

const ROUTES = 'GET /coverage, POST /reset, GET /health';

/**
 * One line on stderr, written at once to descriptor 2. Not through
 * process.stderr: a write it cannot make (a pipe nobody reads, a full disk)
 * is an 'error' event that, unhandled, ends the program.
 */
function complain(what, err) {
  try {
    const detail = err === undefined ? '' : `: ${err && err.message ? err.message : String(err)}`;
    fs.writeSync(2, `livecov: ${(what + detail).replace(/\s*\n\s*/g, ' ')}\n`);
  } catch {
    // Nowhere left to say it.
  }
}

/** Runs `f`, turning any exception into one line on stderr. */
function guarded(what, f) {
  try {
    return f();
  } catch (err) {
    complain(what, err);
    return undefined;
  }
}

// ------------------------------------------------------------ configuration

/** The configuration the environment asks for; null when the hook stays off. Throws with a message saying what to fix. */
function readConfig(env) {
  const get = (name) => (env[`LIVECOV_${name}`] ? env[`LIVECOV_${name}`] : undefined);
  const dir = get('DIR');
  const listen = get('LISTEN');
  if (dir === undefined && listen === undefined) return null;
  const config = {
    dir: dir === undefined ? null : path.resolve(dir),
    listen: listen === undefined ? null : parseListen(listen),
    token: null,
    ignore: null,
    flushMs: null,
    pathMap: [],
    socketMode: 0o600,
    sourceMaps: get('SOURCE_MAPS') !== '0',
  };
  if (get('TOKEN') !== undefined) {
    config.token = get('TOKEN');
  } else if (get('TOKEN_FILE') !== undefined) {
    try {
      config.token = fs.readFileSync(get('TOKEN_FILE'), 'utf8').trim();
    } catch (err) {
      throw new Error(`LIVECOV_TOKEN_FILE=${get('TOKEN_FILE')}: ${err.message}`);
    }
  }
  config.tcpRefusal = tcpRefusal(config, get('LISTEN_WITHOUT_TOKEN'));
  if (config.tcpRefusal !== null) {
    if (config.dir === null) throw new Error(config.tcpRefusal);
    config.listen = null;
  }
  try {
    config.ignore = new RegExp(get('IGNORE') === undefined ? DEFAULT_IGNORE : get('IGNORE'));
  } catch (err) {
    throw new Error(`LIVECOV_IGNORE is not a valid regular expression: ${err.message}`);
  }
  if (get('FLUSH_SECS') !== undefined) {
    const secs = Number(get('FLUSH_SECS'));
    if (!Number.isFinite(secs) || secs <= 0) {
      throw new Error(`LIVECOV_FLUSH_SECS=${JSON.stringify(get('FLUSH_SECS'))} is not a positive number of seconds`);
    }
    config.flushMs = Math.max(1, Math.round(secs * 1000));
  }
  for (const pair of (get('PATH_MAP') || '').split(',').filter((p) => p !== '')) {
    const eq = pair.indexOf('=');
    if (eq < 0) throw new Error(`LIVECOV_PATH_MAP entry ${JSON.stringify(pair)} is not from=to`);
    config.pathMap.push([pair.slice(0, eq), pair.slice(eq + 1)]);
  }
  if (get('SOCKET_MODE') !== undefined) {
    const text = get('SOCKET_MODE').replace(/^0o/, '');
    const mode = /^[0-7]+$/.test(text) ? parseInt(text, 8) : NaN;
    if (!(mode <= 0o777)) {
      throw new Error(`LIVECOV_SOCKET_MODE=${JSON.stringify(get('SOCKET_MODE'))} is not an octal file mode such as 0600`);
    }
    config.socketMode = mode;
  }
  return config;
}

/**
 * Why LIVECOV_LISTEN is not served, or null: an address other than loopback without a token would give the
 * coverage and POST /reset to anyone who reaches the port, so it takes a token or LIVECOV_LISTEN_WITHOUT_TOKEN=1
 * (as the native agents).
 */
function tcpRefusal(config, withoutToken) {
  if (config.listen === null || (config.token !== null && config.token !== '')) return null;
  const { host, port } = config.listen;
  const loopback = host === '::1' || /^127\./.test(host);
  if (loopback || (withoutToken !== undefined && withoutToken !== '0')) return null;
  const shown = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
  return `not listening on ${shown}: it is reachable from other hosts and no token is set; set LIVECOV_TOKEN ` +
    '(or LIVECOV_TOKEN_FILE) to require one, listen on 127.0.0.1, or set LIVECOV_LISTEN_WITHOUT_TOKEN=1 to serve ' +
    'it to anyone who reaches the port';
}

/** `127.0.0.1:9464`, `0.0.0.0:9464` or `[::1]:9464`: an IP address and a port, as the native agents take it. */
function parseListen(text) {
  const bad = () => new Error(`LIVECOV_LISTEN=${JSON.stringify(text)} is not an address such as 0.0.0.0:9464 or 127.0.0.1:9464`);
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([0-9.]+)):([0-9]{1,5})$/.exec(text);
  if (!m) throw bad();
  const host = m[1] || m[2];
  const port = Number(m[3]);
  if (port > 65535 || require('node:net').isIP(host) === 0) throw bad();
  return { host, port };
}

// ------------------------------------------------------- V8 range trees
// The merge of V8 function coverages, ported from @bcoe/v8-coverage (MIT,
// the code c8 merges processes with). V8 resets its counts at every
// takePreciseCoverage, and reports only the ranges whose count differs from
// their parent's, so two takes of one function may have different range
// trees: the trees are split at each other's boundaries and their counts
// (kept as deltas to the parent) added.

class RangeTree {
  constructor(start, end, delta, children) {
    this.start = start;
    this.end = end;
    this.delta = delta;
    this.children = children;
  }

  /** From ranges in pre-order (start ascending, end descending). */
  static fromSortedRanges(ranges) {
    let root;
    const stack = [];
    for (const range of ranges) {
      const node = new RangeTree(range.startOffset, range.endOffset, range.count, []);
      if (root === undefined) {
        root = node;
        stack.push([node, range.count]);
        continue;
      }
      let parent;
      let parentCount;
      for (;;) {
        [parent, parentCount] = stack[stack.length - 1];
        if (range.startOffset < parent.end) break;
        stack.pop();
        if (stack.length === 0) break;
      }
      node.delta -= parentCount;
      parent.children.push(node);
      stack.push([node, range.count]);
    }
    return root;
  }

  /** Joins adjacent children with equal deltas; a child spanning its parent becomes the parent. */
  normalize() {
    const children = [];
    let curEnd;
    let head;
    const tail = [];
    const endChain = () => {
      if (tail.length !== 0) {
        head.end = tail[tail.length - 1].end;
        for (const tailTree of tail) {
          for (const subChild of tailTree.children) {
            subChild.delta += tailTree.delta - head.delta;
            head.children.push(subChild);
          }
        }
        tail.length = 0;
      }
      head.normalize();
      children.push(head);
    };
    for (const child of this.children) {
      if (head === undefined) {
        head = child;
      } else if (child.delta === head.delta && child.start === curEnd) {
        tail.push(child);
      } else {
        endChain();
        head = child;
      }
      curEnd = child.end;
    }
    if (head !== undefined) endChain();
    if (children.length === 1) {
      const child = children[0];
      if (child.start === this.start && child.end === this.end) {
        this.delta += child.delta;
        this.children = child.children;
        return;
      }
    }
    this.children = children;
  }

  /** Cuts this tree at `value` (start < value < end); returns the right part. */
  split(value) {
    let leftChildLen = this.children.length;
    let mid;
    for (let i = 0; i < this.children.length; i++) {
      const child = this.children[i];
      if (child.start < value && value < child.end) {
        mid = child.split(value);
        leftChildLen = i + 1;
        break;
      } else if (child.start >= value) {
        leftChildLen = i;
        break;
      }
    }
    const rightChildren = this.children.splice(leftChildLen, this.children.length - leftChildLen);
    if (mid !== undefined) rightChildren.unshift(mid);
    const result = new RangeTree(value, this.end, this.delta, rightChildren);
    this.end = value;
    return result;
  }

  /** The ranges, in pre-order. */
  toRanges() {
    const ranges = [];
    const stack = [[this, 0]];
    while (stack.length > 0) {
      const [cur, parentCount] = stack.pop();
      const count = parentCount + cur.delta;
      ranges.push({ startOffset: cur.start, endOffset: cur.end, count });
      for (let i = cur.children.length - 1; i >= 0; i--) stack.push([cur.children[i], count]);
    }
    return ranges;
  }
}

function compareRanges(a, b) {
  return a.startOffset !== b.startOffset ? a.startOffset - b.startOffset : b.endOffset - a.endOffset;
}

function normalizedRanges(ranges) {
  const tree = RangeTree.fromSortedRanges([...ranges].sort(compareRanges));
  tree.normalize();
  return tree.toRanges();
}

/** The sum of two coverages of one function (same root range). */
function mergeRanges(a, b) {
  const tree = mergeRangeTrees([
    RangeTree.fromSortedRanges([...a].sort(compareRanges)),
    RangeTree.fromSortedRanges([...b].sort(compareRanges)),
  ]);
  tree.normalize();
  return tree.toRanges();
}

function mergeRangeTrees(trees) {
  if (trees.length <= 1) return trees[0];
  let delta = 0;
  for (const tree of trees) delta += tree.delta;
  return new RangeTree(trees[0].start, trees[0].end, delta, mergeRangeTreeChildren(trees));
}

class StartEventQueue {
  constructor(queue) {
    this.queue = queue;
    this.nextIndex = 0;
    this.pendingOffset = 0;
    this.pendingTrees = undefined;
  }

  static fromParentTrees(parentTrees) {
    const startToTrees = new Map();
    parentTrees.forEach((parentTree, parentIndex) => {
      for (const child of parentTree.children) {
        let trees = startToTrees.get(child.start);
        if (trees === undefined) {
          trees = [];
          startToTrees.set(child.start, trees);
        }
        trees.push({ parentIndex, tree: child });
      }
    });
    const queue = [];
    for (const [offset, trees] of startToTrees) queue.push({ offset, trees });
    queue.sort((a, b) => a.offset - b.offset);
    return new StartEventQueue(queue);
  }

  next() {
    const pendingTrees = this.pendingTrees;
    const nextEvent = this.queue[this.nextIndex];
    if (pendingTrees === undefined) {
      this.nextIndex++;
      return nextEvent;
    }
    if (nextEvent === undefined || this.pendingOffset < nextEvent.offset) {
      this.pendingTrees = undefined;
      return { offset: this.pendingOffset, trees: pendingTrees };
    }
    if (this.pendingOffset === nextEvent.offset) {
      this.pendingTrees = undefined;
      for (const tree of pendingTrees) nextEvent.trees.push(tree);
    }
    this.nextIndex++;
    return nextEvent;
  }
}

function mergeRangeTreeChildren(parentTrees) {
  const result = [];
  const queue = StartEventQueue.fromParentTrees(parentTrees);
  const parentToNested = new Map();
  const insertChild = (parentIndex, tree) => {
    let nested = parentToNested.get(parentIndex);
    if (nested === undefined) {
      nested = [];
      parentToNested.set(parentIndex, nested);
    }
    nested.push(tree);
  };
  const nextChild = (openRange) => {
    const matching = [];
    for (const nested of parentToNested.values()) {
      if (nested.length === 1 && nested[0].start === openRange.start && nested[0].end === openRange.end) {
        matching.push(nested[0]);
      } else {
        matching.push(new RangeTree(openRange.start, openRange.end, 0, nested));
      }
    }
    parentToNested.clear();
    return mergeRangeTrees(matching);
  };
  let openRange;
  for (;;) {
    const event = queue.next();
    if (event === undefined) break;
    if (openRange !== undefined && openRange.end <= event.offset) {
      result.push(nextChild(openRange));
      openRange = undefined;
    }
    if (openRange === undefined) {
      let openRangeEnd = event.offset + 1;
      for (const { parentIndex, tree } of event.trees) {
        openRangeEnd = Math.max(openRangeEnd, tree.end);
        insertChild(parentIndex, tree);
      }
      queue.pendingOffset = openRangeEnd;
      openRange = { start: event.offset, end: openRangeEnd };
    } else {
      for (const { parentIndex, tree } of event.trees) {
        if (tree.end > openRange.end) {
          const right = tree.split(openRange.end);
          if (queue.pendingTrees === undefined) queue.pendingTrees = [];
          queue.pendingTrees.push({ parentIndex, tree: right });
        }
        insertChild(parentIndex, tree);
      }
    }
  }
  if (openRange !== undefined) result.push(nextChild(openRange));
  return result;
}

// ------------------------------------------------------------ collector

/**
 * Running totals of V8's precise coverage, per script URL and function
 * (keyed by the function's own range): of one isolate, or summed over
 * several (the main thread's and its workers').
 */
class Counts {
  constructor() {
    /** url -> Map("start;end" -> {functionName, ranges}) */
    this.scripts = new Map();
  }

  /** Adds the scripts of a takePreciseCoverage result (the counts since the take before it) that `keep(url)` wants. */
  add(result, keep) {
    for (const script of result) {
      if (!keep(script.url)) continue;
      for (const fn of script.functions) this.addFunction(script.url, fn.functionName, fn.ranges, true);
    }
  }

  addFunction(url, functionName, ranges, raw) {
    let functions = this.scripts.get(url);
    if (functions === undefined) {
      functions = new Map();
      this.scripts.set(url, functions);
    }
    const root = ranges[0];
    const key = `${root.startOffset};${root.endOffset}`;
    const total = functions.get(key);
    if (total === undefined) {
      // Range arrays are never changed in place (merges make new ones), so totals may share them.
      functions.set(key, { functionName, ranges: raw ? normalizedRanges(ranges) : ranges });
    } else if (ranges.some((r) => r.count !== 0)) {
      total.ranges = mergeRanges(total.ranges, ranges);
    }
  }

  /** The same functions and ranges with count 0: what a reset leaves (the functions seen stay in reports). */
  zeroed() {
    const zero = new Counts();
    for (const [url, functions] of this.scripts) {
      const copy = new Map();
      for (const [key, fn] of functions) {
        copy.set(key, { functionName: fn.functionName, ranges: fn.ranges.map((r) => ({ ...r, count: 0 })) });
      }
      zero.scripts.set(url, copy);
    }
    return zero;
  }

  /** Adds another's totals, function by function. */
  merge(other) {
    for (const [url, functions] of other.scripts) {
      for (const fn of functions.values()) this.addFunction(url, fn.functionName, fn.ranges, false);
    }
  }

  /** The sum of several totals; one of them as it is when the others are empty. */
  static sum(list) {
    const nonEmpty = list.filter((c) => c.scripts.size > 0);
    if (nonEmpty.length === 1) return nonEmpty[0];
    const sum = new Counts();
    for (const counts of nonEmpty) sum.merge(counts);
    return sum;
  }
}

/** V8's precise coverage of the calling thread's isolate, through an in-process inspector session. */
class Collector {
  constructor(inspector) {
    this.session = new inspector.Session();
    this.session.connect();
  }

  /**
   * An inspector call, answered before it returns: an in-process session
   * dispatches to V8 synchronously, which the final report at process exit
   * relies on (no event loop turn is left then). Checked, not assumed.
   */
  post(method, params) {
    let answered = false;
    let error;
    let result;
    this.session.post(method, params, (err, res) => {
      answered = true;
      error = err;
      result = res;
    });
    if (!answered) throw new Error(`the inspector did not answer ${method} synchronously; this Node.js version is not supported`);
    if (error) throw new Error(`${method}: ${error.message}`);
    return result;
  }

  start() {
    this.post('Profiler.enable');
    this.post('Profiler.startPreciseCoverage', { callCount: true, detailed: true });
  }

  stop() {
    this.post('Profiler.stopPreciseCoverage');
    this.post('Profiler.disable');
    this.session.disconnect();
  }

  /** The counts since the last take: V8 zeroes them at every take. */
  take() {
    return this.post('Profiler.takePreciseCoverage').result;
  }
}

// ---------------------------------------------------------- worker threads
// V8 counts per isolate: every worker thread has its own counts, which only
// code in that thread can take. The hook is preloaded into workers too
// (NODE_OPTIONS reaches them), and there it only takes its thread's counts
// and sends them to the main thread, which keeps every total and serves the
// one report of the process. Two BroadcastChannels, named after the
// instance: workers send on `counts` (hello, their counts, their last
// counts at exit) and listen on `take`, where the main thread asks for
// their counts before each report. Only the main thread listens on
// `counts`: a channel nobody reads would keep every message. None of this
// reaches the program's own ports, and nothing of it keeps a thread alive.

/** How workers learn that the main thread's hook runs, and under which instance: environment data reaches every new worker, nested ones included. */
const WORKER_DATA_KEY = 'livecov.hook';

function channelNames(instance) {
  return { counts: `livecov:${instance}:counts`, take: `livecov:${instance}:take` };
}

/** Posts one message on a BroadcastChannel opened for it: the message is queued for the receiver before postMessage returns. */
function broadcast(name, message) {
  const { BroadcastChannel } = require('node:worker_threads');
  const channel = new BroadcastChannel(name);
  try {
    channel.postMessage(message);
  } finally {
    channel.close();
  }
}

/**
 * The main thread's totals: its own counts, those of each running worker,
 * and the sum of the workers that ended. A report asks every running worker
 * for its counts, waits for the answers (on the event loop, never blocking
 * the program; at exit, where no turn is left, polling the channel), then
 * takes the main thread's own.
 */
class Hub {
  constructor(instance, collector, reportable) {
    const { BroadcastChannel } = require('node:worker_threads');
    this.collector = collector;
    this.reportable = reportable;
    /** url -> whether its coverage is kept (decided once per URL). */
    this.kept = new Map();
    this.keep = (url) => {
      let keep = this.kept.get(url);
      if (keep === undefined) {
        keep = this.reportable(url);
        this.kept.set(url, keep);
      }
      return keep;
    };
    this.own = new Counts();
    this.ended = new Counts();
    /** threadId -> Counts of a running worker. */
    this.live = new Map();
    /** url -> source map payload, of scripts that workers loaded (the main thread's Node.js knows its own). */
    this.workerMaps = new Map();
    /** Reports waiting for workers' answers. */
    this.pending = new Set();
    this.lastRequest = 0;
    this.names = channelNames(instance);
    this.channel = new BroadcastChannel(this.names.counts);
    this.channel.unref();
    this.channel.onmessage = (event) => guarded('cannot read the counts of a worker thread', () => this.onMessage(event.data));
  }

  close() {
    this.channel.close();
  }

  onMessage(message) {
    const thread = message.thread;
    if (message.kind === 'hello') {
      if (!this.live.has(thread)) this.live.set(thread, new Counts());
    } else if (message.kind === 'counts') {
      // A worker is running from its hello to its end; nothing it sent can come later than its end.
      const counts = this.live.get(thread) || this.ended;
      counts.add(message.result, this.keep);
      for (const [url, payload] of Object.entries(message.maps)) this.workerMaps.set(url, payload);
      if (message.final) this.gone(thread);
      else if (message.request !== null) this.answered(thread, message.request);
    } else if (message.kind === 'gone') {
      this.gone(thread);
    }
  }

  /** Messages already queued, read now: at a worker's end, before a request, and while waiting at exit. */
  drain() {
    const { receiveMessageOnPort } = require('node:worker_threads');
    for (let m = receiveMessageOnPort(this.channel); m !== undefined; m = receiveMessageOnPort(this.channel)) {
      guarded('cannot read the counts of a worker thread', () => this.onMessage(m.message));
    }
  }

  /** A worker took its counts for requests up to `upTo`: each resetting report among them cuts the worker's totals there. */
  answered(thread, upTo) {
    for (const request of this.pending) {
      if (request.id > upTo || !request.waiting.has(thread)) continue;
      request.waiting.delete(thread);
      if (request.reset) {
        const counts = this.live.get(thread);
        request.cuts.push(counts);
        this.live.set(thread, counts.zeroed());
      }
      if (request.waiting.size === 0) request.resolve();
    }
  }

  /** A worker ended (its last counts in, or terminated without them): its totals join the ended workers'. */
  gone(thread) {
    if (!this.live.has(thread)) return;
    this.answered(thread, Infinity);
    this.ended.merge(this.live.get(thread));
    this.live.delete(thread);
  }

  /** Asks every running worker for its counts. */
  request(reset) {
    this.drain();
    const request = { id: ++this.lastRequest, reset, waiting: new Set(this.live.keys()), cuts: [], resolve: null };
    request.done = new Promise((resolve) => {
      request.resolve = resolve;
    });
    if (request.waiting.size === 0) {
      request.resolve();
    } else {
      this.pending.add(request);
      broadcast(this.names.take, { kind: 'take', request: request.id });
    }
    return request;
  }

  /**
   * The totals of the report: the main thread's counts taken now, the
   * ended workers', and every worker's up to its answer, with what it sent
   * since (all of it, for one that did not answer). With `reset`, each
   * worker starts again from zero at its answer, the rest now: nothing is
   * counted twice, nothing lost.
   */
  cut(request) {
    this.pending.delete(request);
    if (request.waiting.size > 0) {
      const [s, its] = request.waiting.size > 1 ? ['s', 'their'] : ['', 'its'];
      complain(
        `worker thread${s} ${[...request.waiting].join(', ')} did not send ${its} counts in time (busy?): ` +
          `this report has ${its} counts as of ${its} last answer, a later report the rest`,
      );
    }
    this.own.add(this.collector.take(), this.keep);
    const parts = [this.own, this.ended, ...request.cuts];
    for (const [thread, counts] of this.live) {
      parts.push(counts);
      if (request.reset) this.live.set(thread, counts.zeroed());
    }
    const sum = Counts.sum(parts);
    if (request.reset) {
      this.own = this.own.zeroed();
      this.ended = this.ended.zeroed();
    }
    return sum;
  }

  /** The totals, once every running worker answered (LIMITS.workerAnswerMs at most). */
  async totals(reset) {
    const request = this.request(reset);
    if (request.waiting.size > 0) {
      let timer;
      await Promise.race([request.done, new Promise((resolve) => (timer = setTimeout(resolve, LIMITS.workerAnswerMs).unref()))]);
      clearTimeout(timer);
    }
    return this.cut(request);
  }

  /**
   * The totals now, without the event loop (at exit, or in a signal
   * listener before the process may end): workers run on their own
   * threads and answer while this one polls the channel
   * (LIMITS.workerAnswerAtExitMs at most).
   */
  totalsNow() {
    const request = this.request(false);
    const deadline = Date.now() + LIMITS.workerAnswerAtExitMs;
    const sleep = new Int32Array(new SharedArrayBuffer(4));
    while (request.waiting.size > 0 && Date.now() < deadline) {
      this.drain();
      if (request.waiting.size > 0) Atomics.wait(sleep, 0, 0, 1);
    }
    return this.cut(request);
  }
}

/**
 * The hook in a worker thread: V8's counts of this thread, taken when the
 * main thread asks (every report, the periodic ones included) and at the
 * thread's end (`exit` runs in the worker after its last code, an uncaught
 * exception included), sent to the main thread. `worker.terminate()` gives
 * the thread no `exit`: what it ran since its last take is not counted.
 */
function workerBoot(shared) {
  const wt = require('node:worker_threads');
  const names = channelNames(shared.instance);
  const thread = wt.threadId;
  if (shared.sourceMaps) process.setSourceMapsEnabled(true);
  const collector = new Collector(require('node:inspector'));
  collector.start();
  const mapsSent = new Set();
  const send = (request, final) => {
    const result = collector.take().filter((s) => {
      const file = urlToPath(s.url);
      return file !== null && file !== __filename;
    });
    // A script only this thread loaded has its source map in this thread's Node.js only.
    const maps = {};
    for (const { url } of result) {
      if (mapsSent.has(url)) continue;
      mapsSent.add(url);
      const found = shared.sourceMaps ? findSourceMap(url) : undefined;
      if (found && found.payload) maps[url] = found.payload;
    }
    broadcast(names.counts, { kind: 'counts', thread, request, final, result, maps });
  };
  const take = new wt.BroadcastChannel(names.take);
  take.unref();
  take.onmessage = (event) => guarded(`cannot send the counts of worker thread ${thread}`, () => send(event.data.request, false));
  broadcast(names.counts, { kind: 'hello', thread });
  process.on('exit', () =>
    guarded(`no last counts of worker thread ${thread}`, () => {
      take.close();
      send(null, true);
    }),
  );
  watchWorkers((nested) => broadcast(names.counts, { kind: 'gone', thread: nested }));
}

/** Watches the workers this thread starts: one that is terminated sends no last counts, and no report must wait for it. */
function watchWorkers(onGone) {
  process.on('worker', (worker) =>
    guarded('cannot watch a worker thread', () => {
      const thread = worker.threadId;
      worker.once('exit', () => guarded('cannot account for a worker thread that ended', () => onGone(thread)));
    }),
  );
}

// --------------------------------------------------------------- sources

/** The lines of a source text as v8-to-istanbul cuts them: the text without trailing white space, `start`/`end` offsets without the newline. */
function sourceLines(text) {
  const trimmed = text.trimEnd();
  const lines = [];
  let position = 0;
  for (const lineStr of trimmed.split(/(?<=\r?\n)/u)) {
    const newline = /\r?\n$/u.exec(lineStr);
    lines.push({ start: position, end: position + lineStr.length - (newline ? newline[0].length : 0) });
    position += lineStr.length;
  }
  return { lines, eof: trimmed.length };
}

/**
 * The lines overlapping [start, end], as indices [first, last + 1): the
 * search of v8-to-istanbul's sliceRange, kept as it is so that lines come
 * out as in c8.
 */
function sliceBounds(lines, startCol, endCol, inclusive = false) {
  let start = 0;
  let end = lines.length;
  if (inclusive) --startCol;
  while (start < end) {
    let mid = (start + end) >> 1;
    if (startCol >= lines[mid].end) {
      start = mid + 1;
    } else if (endCol < lines[mid].start) {
      end = mid - 1;
    } else {
      end = mid;
      while (mid >= 0 && startCol < lines[mid].end && endCol >= lines[mid].start) --mid;
      start = mid + 1;
      break;
    }
  }
  while (end < lines.length && startCol < lines[end].end && endCol >= lines[end].start) ++end;
  return [start, Math.max(start, end)];
}

/** The 0-based index of the line holding `offset`. */
function lineIndexAt(lines, offset) {
  let lo = 0;
  let hi = lines.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (lines[mid].start <= offset) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

const BASE64 = new Map([...'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'].map((c, i) => [c, i]));

/** Source map `mappings` -> per generated line, segments [column, source, line, column] sorted by column (all 0-based). */
function decodeMappings(mappings) {
  const lines = [];
  let source = 0;
  let origLine = 0;
  let origCol = 0;
  for (const lineText of mappings.split(';')) {
    const segments = [];
    let genCol = 0;
    for (const segText of lineText.split(',')) {
      if (segText === '') continue;
      const values = [];
      let value = 0;
      let shift = 0;
      for (const c of segText) {
        const digit = BASE64.get(c);
        if (digit === undefined) throw new Error(`invalid character ${JSON.stringify(c)} in source map mappings`);
        value += (digit & 31) << shift;
        if (digit & 32) {
          shift += 5;
        } else {
          values.push(value & 1 ? -(value >>> 1) : value >>> 1);
          value = 0;
          shift = 0;
        }
      }
      genCol += values[0];
      if (values.length >= 4) {
        source += values[1];
        origLine += values[2];
        origCol += values[3];
        segments.push([genCol, source, origLine, origCol]);
      } else {
        segments.push([genCol]);
      }
    }
    segments.sort((a, b) => a[0] - b[0]);
    lines.push(segments);
  }
  return lines;
}

/**
 * A decoded source map with the lookups v8-to-istanbul makes through
 * @jridgewell/trace-mapping: original position of a generated one (greatest
 * lower bound or least upper bound on the same line), and the generated
 * position of an original one (least upper bound on the same original line).
 * Lines are 1-based, columns 0-based, as there.
 */
class DecodedMap {
  constructor(payload) {
    this.sources = payload.sources;
    this.lines = decodeMappings(payload.mappings);
    /** source -> original line -> segments [origCol, genLine, genCol] sorted. */
    this.bySource = this.sources.map(() => []);
    this.lines.forEach((segments, genLine) => {
      for (const s of segments) {
        if (s.length < 4) continue;
        const perLine = this.bySource[s[1]];
        if (perLine === undefined) continue;
        (perLine[s[2]] = perLine[s[2]] || []).push([s[3], genLine, s[0]]);
      }
    });
    for (const perLine of this.bySource) {
      for (const segs of perLine) if (segs) segs.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]);
    }
  }

  /** { source, line, column } or { source: null, line: null }. */
  originalPositionFor(line, column, leastUpperBound) {
    const none = { source: null, line: null, column: null };
    const segments = this.lines[line - 1];
    if (segments === undefined || segments.length === 0) return none;
    let found = -1;
    if (leastUpperBound) {
      for (let i = 0; i < segments.length; i++) {
        if (segments[i][0] >= column) {
          found = i;
          break;
        }
      }
    } else {
      for (let i = segments.length - 1; i >= 0; i--) {
        if (segments[i][0] <= column) {
          found = i;
          break;
        }
      }
      // trace-mapping returns the first of equal columns, the greatest of the lower ones.
      while (found > 0 && segments[found - 1][0] === segments[found][0]) found--;
    }
    if (found < 0) return none;
    const s = segments[found];
    if (s.length < 4) return none;
    return { source: s[1], line: s[2] + 1, column: s[3] };
  }

  /** The generated position of the first mapping at or after (line, column) on that original line, or null. */
  generatedPositionFor(source, line, column) {
    const segs = (this.bySource[source] || [])[line - 1];
    if (!segs) return null;
    for (const s of segs) if (s[0] >= column) return { line: s[1] + 1, column: s[2] };
    return null;
  }

  /** GLB, then LUB, and the mapping at column 0 when it names a later original line (v8-to-istanbul's originalPositionTryBoth). */
  tryBoth(line, column) {
    let original = this.originalPositionFor(line, column, false);
    if (original.line === null) original = this.originalPositionFor(line, column, true);
    const min = this.originalPositionFor(line, 0, false);
    if (min.line !== null && original.line !== null && min.line > original.line) original = min;
    return original;
  }

  /** v8-to-istanbul's originalEndPositionFor: where the original token that ends at (line, column) ends. */
  originalEndPositionFor(line, column) {
    const before = this.tryBoth(line, Math.max(column - 1, 1));
    if (before.source === null) return null;
    const after = this.generatedPositionFor(before.source, before.line, before.column + 1);
    if (after === null || this.originalPositionFor(after.line, after.column, false).line !== before.line) {
      return { source: before.source, line: before.line, column: Infinity };
    }
    return this.originalPositionFor(after.line, after.column, false);
  }
}

/** The text of a file, without a byte order mark (Node.js strips it before compiling). */
function readSource(file) {
  const text = fs.readFileSync(file, 'utf8');
  return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
}

function urlToPath(url) {
  if (url.startsWith('file://')) return fileURLToPath(url);
  if (url.startsWith('/')) return url;
  return null;
}

// ------------------------------------------------------------- reports

/**
 * Per original file: line counts, functions and branches. Computed from the
 * collector's totals at each dump; the sources and source maps of scripts
 * are read once and kept.
 */
class Reporter {
  constructor(config, useSourceMaps, workerMaps) {
    this.config = config;
    this.workerMaps = workerMaps;
    this.useSourceMaps = useSourceMaps;
    /** url -> script info, or null when it cannot be reported. */
    this.scripts = new Map();
    /** original source path -> { text, lines, eof } or null. */
    this.originals = new Map();
  }

  scriptInfo(url) {
    if (this.scripts.has(url)) return this.scripts.get(url);
    const info = guarded(`cannot read the source of ${url}`, () => {
      const file = urlToPath(url);
      const { lines, eof } = sourceLines(readSource(file));
      return { file, lines, eof, map: this.useSourceMaps ? this.sourceMap(url, file) : null };
    });
    this.scripts.set(url, info || null);
    return info || null;
  }

  /** Node.js's source map of a script (found and parsed by Node.js), decoded; null without one. */
  sourceMap(url, file) {
    const found = findSourceMap(url) || findSourceMap(file);
    const payload = found && found.payload ? found.payload : this.workerMaps.get(url);
    if (!payload) return null;
    if (typeof payload.mappings !== 'string' || !Array.isArray(payload.sources)) {
      complain(`the source map of ${file} is an index map (sections), which is not supported: reporting the generated file`);
      return null;
    }
    const map = new DecodedMap(payload);
    map.paths = payload.sources.map((s) => (s.startsWith('file://') ? fileURLToPath(s) : s));
    map.contents = payload.sourcesContent || [];
    return map;
  }

  original(map, source) {
    const file = map.paths[source];
    if (this.originals.has(file)) return this.originals.get(file);
    let text = map.contents[source];
    if (typeof text !== 'string') {
      text = guarded(`cannot read ${file}, a source of a source map`, () => readSource(file));
    }
    const original = typeof text === 'string' ? sourceLines(text) : null;
    this.originals.set(file, original);
    return original;
  }

  /**
   * Original file path -> { counts (per line), functions, branches }, of
   * every file with coverage in `counts`. (Generated files the
   * configuration ignores were left out of the counts already.)
   */
  files(counts) {
    const files = new Map();
    const fileRecord = (file) => {
      let record = files.get(file);
      if (record === undefined) {
        record = { counts: null, functions: [], branches: [] };
        files.set(file, record);
      }
      return record;
    };
    for (const [url, functions] of counts.scripts) {
      const script = this.scriptInfo(url);
      if (script === null) continue;
      const sorted = [...functions.values()].sort((a, b) => compareRanges(a.ranges[0], b.ranges[0]));
      const top = sorted.find((fn) => fn.ranges[0].startOffset === 0 && fn.functionName === '');
      const moduleCount = top ? top.ranges[0].count : 0;
      if (script.map === null) {
        const target = { lines: script.lines, eof: script.eof };
        const record = fileRecord(script.file);
        const counts = new Array(script.lines.length).fill(moduleCount);
        for (const fn of sorted) {
          fn.ranges.forEach((range, i) => {
            const startCol = Math.max(0, range.startOffset);
            const endCol = Math.min(script.eof, range.endOffset);
            collect(record, counts, target, fn, range, i, startCol, endCol, fn === top);
          });
        }
        addCounts(record, counts);
      } else {
        this.collectMapped(script, sorted, top, moduleCount, fileRecord);
      }
    }
    return files;
  }

  /** Ranges of a source-mapped script, remapped as v8-to-istanbul does, onto the original files. */
  collectMapped(script, sorted, top, moduleCount, fileRecord) {
    const map = script.map;
    const targets = new Map();
    const target = (source) => {
      if (targets.has(source)) return targets.get(source);
      let t = null;
      const file = map.paths[source];
      if (file !== undefined && file !== __filename && !this.config.ignore.test(file)) {
        const original = this.original(map, source);
        if (original !== null) {
          t = { ...original, record: fileRecord(file), counts: new Array(original.lines.length).fill(moduleCount) };
        }
      }
      targets.set(source, t);
      return t;
    };
    // Every source the map names gets its lines, even one no range lands in.
    map.sources.forEach((_, source) => target(source));
    for (const fn of sorted) {
      fn.ranges.forEach((range, i) => {
        const startCol = Math.max(0, range.startOffset);
        const endCol = Math.min(script.eof, range.endOffset);
        const mapped = remap(map, script.lines, startCol, endCol);
        if (mapped === null) return;
        const t = target(mapped.source);
        if (t === null) return;
        const start = relativeToOffset(t, mapped.startLine, mapped.startColumn);
        const end = relativeToOffset(t, mapped.endLine, mapped.endColumn);
        collect(t.record, t.counts, t, fn, range, i, start, end, fn === top);
      });
    }
    for (const t of targets.values()) if (t !== null) addCounts(t.record, t.counts);
  }
}

/** A generated range [startCol, endCol) -> the original source and positions, or null (v8-to-istanbul's offsetToOriginalRelative). */
function remap(map, lines, startCol, endCol) {
  const [from, to] = sliceBounds(lines, startCol, endCol, true);
  if (from >= to) return null;
  const first = lines[from];
  const last = lines[to - 1];
  const firstLine = from + 1;
  const lastLine = to;
  const start = map.tryBoth(firstLine, Math.max(0, startCol - first.start));
  if (start.source === null) return null;
  let end = map.originalEndPositionFor(lastLine, endCol - last.start);
  if (end === null || end.source === null || start.source !== end.source) return null;
  if (start.line === end.line && start.column === end.column) {
    end = map.originalPositionFor(lastLine, endCol - last.start, true);
    if (end.line === null) return null;
    end = { ...end, column: end.column - 1 };
  }
  return { source: start.source, startLine: start.line, startColumn: start.column, endLine: end.line, endColumn: end.column };
}

function relativeToOffset(target, line, column) {
  const l = target.lines[Math.max(line, 1) - 1];
  if (l === undefined) return target.eof;
  return Math.min(l.start + column, l.end);
}

/**
 * One range of a function, in the coordinates of the file it lands in:
 * the lines it wholly contains take its count (later, inner ranges
 * overwrite), its first range makes the function record and the others
 * branches. The module's own top-level function is not a function.
 */
function collect(record, counts, target, fn, range, index, startCol, endCol, isModule) {
  const [from, to] = sliceBounds(target.lines, startCol, endCol);
  if (from >= to) return;
  const startLine = lineIndexAt(target.lines, startCol);
  const column = startCol - target.lines[startLine].start;
  if (index === 0) {
    if (!isModule) record.functions.push({ name: fn.functionName, line: startLine + 1, column, count: range.count });
  } else {
    record.branches.push({ line: startLine + 1, column, end: endCol, count: range.count });
  }
  for (let k = from; k < to; k++) {
    const line = target.lines[k];
    if (startCol <= line.start && endCol >= line.end) counts[k] = range.count;
  }
}

function addCounts(record, counts) {
  if (record.counts === null) {
    record.counts = counts;
  } else {
    for (let i = 0; i < counts.length; i++) record.counts[i] += counts[i];
  }
}

/**
 * Names unique within a file, as livecov merge keys functions by name: a
 * name given twice, and every anonymous function, gets its position. (A
 * process reports only the functions V8 compiled, so an anonymous function
 * named by its rank among them could be another in the next process.)
 */
function functionNames(functions) {
  const base = (fn) => (fn.name === '' ? '(anonymous)' : fn.name.replace(/[\r\n]+/g, ' '));
  const seen = new Map([['(anonymous)', 2]]);
  for (const fn of functions) seen.set(base(fn), (seen.get(base(fn)) || 0) + 1);
  const used = new Set();
  return functions.map((fn) => {
    let name = base(fn);
    if (seen.get(name) > 1) name = `${name} (${fn.line}:${fn.column + 1})`;
    let unique = name;
    for (let n = 2; used.has(unique); n++) unique = `${name} #${n}`;
    used.add(unique);
    return unique;
  });
}

function mapPath(file, pathMap) {
  for (const [from, to] of pathMap) if (file.startsWith(from)) return to + file.slice(from.length);
  return file;
}

/** The LCOV report, in the layout of llvm-cov export -format=lcov (what livecov merge writes too). */
function renderLcov(files, pathMap, testName) {
  const records = [...files].map(([file, record]) => [mapPath(file, pathMap), record]);
  records.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const out = [];
  for (const [file, record] of records) {
    if (testName) out.push(`TN:${testName}`);
    out.push(`SF:${file}`);
    const functions = [...record.functions].sort((a, b) => a.line - b.line || a.column - b.column);
    const names = functionNames(functions);
    functions.forEach((fn, i) => out.push(`FN:${fn.line},${names[i]}`));
    functions.forEach((fn, i) => out.push(`FNDA:${fn.count},${names[i]}`));
    out.push(`FNF:${functions.length}`, `FNH:${functions.filter((f) => f.count > 0).length}`);
    const counts = record.counts || [];
    counts.forEach((count, i) => out.push(`DA:${i + 1},${count}`));
    const branches = [...record.branches].sort((a, b) => a.line - b.line || a.column - b.column || b.end - a.end);
    let previous = null;
    let n = 0;
    for (const b of branches) {
      const key = `${b.line}:${b.column}`;
      n = key === previous ? n + 1 : 0;
      previous = key;
      out.push(`BRDA:${b.line},${b.column},${n},${b.count}`);
    }
    out.push(`BRF:${branches.length}`, `BRH:${branches.filter((b) => b.count > 0).length}`);
    out.push(`LF:${counts.length}`, `LH:${counts.filter((c) => c > 0).length}`, 'end_of_record');
  }
  return out.length === 0 ? '' : `${out.join('\n')}\n`;
}

/** Per-file and total counts of an LCOV report: the native agents' `?format=json`. */
function summaryJson(lcov) {
  const files = [];
  const totals = [0, 0, 0, 0, 0, 0];
  const tags = ['LF:', 'LH:', 'FNF:', 'FNH:', 'BRF:', 'BRH:'];
  let current = null;
  for (const line of lcov.split('\n')) {
    if (line.startsWith('SF:')) {
      current = { file: line.slice(3), c: [0, 0, 0, 0, 0, 0] };
    } else if (current !== null && line === 'end_of_record') {
      const c = current.c;
      c.forEach((v, i) => (totals[i] += v));
      files.push({ branches: c[4], branches_hit: c[5], file: current.file, functions: c[2], functions_hit: c[3], lines: c[0], lines_hit: c[1] });
      current = null;
    } else if (current !== null) {
      tags.forEach((tag, i) => {
        if (line.startsWith(tag)) current.c[i] = Number(line.slice(tag.length));
      });
    }
  }
  const t = totals;
  return JSON.stringify({
    files,
    totals: { branches: t[4], branches_hit: t[5], functions: t[2], functions_hit: t[3], lines: t[0], lines_hit: t[1] },
  });
}

/** Writes to a temporary name beside `file`, then renames: readers never see a torn file. */
function writeAtomically(file, text) {
  const tmp = file.replace(/\.[^./]*$/, '') + `.tmp${process.pid}`;
  try {
    fs.writeFileSync(tmp, text);
    fs.renameSync(tmp, file);
  } catch (err) {
    try {
      fs.unlinkSync(tmp);
    } catch {
      // Never written.
    }
    throw err;
  }
}

// ------------------------------------------------------------- the agent

class Hook {
  constructor(config, collector, reportable, useSourceMaps) {
    this.config = config;
    this.instance = `${RUNTIME}-${process.pid}-${randomHex()}`;
    this.hub = new Hub(this.instance, collector, reportable);
    this.reporter = new Reporter(config, useSourceMaps, this.hub.workerMaps);
    this.startTime = Math.floor(Date.now() / 1000);
    this.clock = process.hrtime.bigint();
    this.program = process.argv[1] ? path.resolve(process.argv[1]) : process.execPath;
    this.tcpAddress = null;
    this.finished = false;
    this.servers = [];
    this.socketPath = config.dir === null ? null : path.join(config.dir, 'sockets', `${this.instance}.sock`);
    this.tokenDigest = config.token ? digest(config.token) : null;
  }

  reportPath(extension) {
    return this.config.dir === null ? null : path.join(this.config.dir, 'reports', `${this.instance}.${extension}`);
  }

  /** The LCOV of the counts since start or the last reset, the worker threads' with the main thread's. */
  async lcov(testName, reset) {
    return this.render(await this.hub.totals(reset), testName);
  }

  /** The same without the event loop, for the reports written when the process may end. */
  lcovNow() {
    return this.render(this.hub.totalsNow(), null);
  }

  render(counts, testName) {
    return renderLcov(this.reporter.files(counts), this.config.pathMap, testName);
  }

  metadata(state) {
    return JSON.stringify({
      instance: this.instance,
      pid: process.pid,
      ppid: process.ppid,
      runtime: RUNTIME,
      livecov_version: LIVECOV_VERSION,
      program: this.program,
      build_id: null,
      modules: [],
      tcp: this.tcpAddress,
      start_time: this.startTime,
      uptime_secs: Number(process.hrtime.bigint() - this.clock) / 1e9,
      state,
    });
  }

  writeMetadata(state) {
    const file = this.reportPath('json');
    if (file !== null) guarded(`cannot write ${file}`, () => writeAtomically(file, this.metadata(state)));
  }

  writeReport() {
    const file = this.reportPath('lcov');
    if (file !== null) guarded(`cannot write ${file}`, () => writeAtomically(file, this.lcovNow()));
  }

  /** The final report, once; then the metadata says the process ended and the socket goes. Synchronous: runs in 'exit'. */
  finish() {
    if (this.finished) return;
    this.finished = true;
    this.writeReport();
    this.writeMetadata('exited');
    for (const server of this.servers) guarded('cannot close the server', () => server.close());
    if (this.socketPath !== null) {
      try {
        fs.unlinkSync(this.socketPath);
      } catch {
        // Already gone.
      }
    }
  }

  start() {
    if (this.config.dir !== null) {
      for (const sub of ['sockets', 'reports']) fs.mkdirSync(path.join(this.config.dir, sub), { recursive: true });
      this.listenUnix();
    }
    if (this.config.listen !== null) this.listenTcp();
    if (this.config.tcpRefusal !== null) complain(`${this.config.tcpRefusal} (the socket in LIVECOV_DIR serves)`);
    this.writeMetadata('running');
    process.on('exit', () => guarded('no final report', () => this.finish()));
    for (const signal of ['SIGTERM', 'SIGINT']) {
      const listener = () => guarded(`while handling ${signal}`, () => this.onSignal(signal, listener));
      process.on(signal, listener);
    }
    if (this.config.flushMs !== null) {
      // On the event loop: the program runs on while workers send their counts.
      const file = this.reportPath('lcov');
      setInterval(() => {
        this.lcov(null, false).then(
          (lcov) => guarded(`cannot write ${file}`, () => this.finished || writeAtomically(file, lcov)),
          (err) => complain(`no report for ${file}`, err),
        );
      }, this.config.flushMs).unref();
    }
  }

  /**
   * SIGTERM/SIGINT. When the program listens for the signal itself, its
   * handler decides what happens: the hook steps aside for this delivery (a
   * handler that re-raises only when it is the signal's last listener, as
   * signal-exit does, must see it alone) after leaving a report in case the
   * process goes. Otherwise the process would have died of the signal: the
   * hook writes the final report, stops listening and raises the signal
   * again, so the exit status is the signal's.
   */
  onSignal(signal, listener) {
    if (process.listeners(signal).some((l) => l !== listener)) {
      if (this.finished) return;
      this.writeReport();
      process.removeListener(signal, listener);
      setImmediate(() =>
        guarded(`cannot listen for ${signal} again`, () => {
          if (!this.finished && !process.listeners(signal).includes(listener)) process.on(signal, listener);
        }),
      );
      return;
    }
    this.finish();
    process.removeListener(signal, listener);
    process.kill(process.pid, signal);
  }

  /** A server of the protocol; `tcp` servers require the token. Never keeps the process alive. */
  server(tcp) {
    const server = http.createServer({ maxHeaderSize: LIMITS.maxHeaderBytes }, (req, res) => {
      try {
        this.handle(req, res, tcp);
      } catch (err) {
        complain('internal error while answering a request', err);
        guarded('cannot answer a request', () => {
          if (!res.headersSent) this.error(res, 500, `internal error in the livecov hook: ${err && err.message}`);
        });
      }
    });
    server.maxHeadersCount = LIMITS.maxHeaders;
    server.maxConnections = LIMITS.maxConnections;
    server.headersTimeout = LIMITS.headersTimeoutMs;
    server.requestTimeout = LIMITS.requestTimeoutMs;
    server.keepAliveTimeout = LIMITS.idleTimeoutMs;
    server.timeout = LIMITS.idleTimeoutMs;
    server.on('connection', (socket) => socket.unref());
    server.on('clientError', (err, socket) => guarded('cannot answer a malformed request', () => this.clientError(err, socket)));
    server.unref();
    this.servers.push(server);
    return server;
  }

  listenUnix() {
    const server = this.server(false);
    const socketPath = this.socketPath;
    server.on('error', (err) => complain(`cannot listen on ${socketPath}`, err));
    // Bound in listen() itself: the umask keeps the file from ever being more open than its mode.
    const umask = process.umask(0o177);
    // A socket address holds at most 107 bytes of path: a deeper
    // LIVECOV_DIR is reached through the folder's descriptor.
    let folder = null;
    try {
      let address = socketPath;
      if (Buffer.byteLength(socketPath) > 107) {
        folder = fs.openSync(path.dirname(socketPath), 'r');
        address = `/proc/self/fd/${folder}/${path.basename(socketPath)}`;
      }
      server.listen({ path: address, exclusive: true });
    } finally {
      process.umask(umask);
      if (folder !== null) {
        fs.closeSync(folder);
      }
    }
    guarded(`cannot set the mode of ${socketPath}`, () => fs.chmodSync(socketPath, this.config.socketMode));
  }

  listenTcp() {
    const { host, port } = this.config.listen;
    const server = this.server(true);
    server.on('error', (err) => complain(`cannot listen on ${host}:${port} (LIVECOV_LISTEN)`, err));
    server.on('listening', () =>
      guarded('cannot read the TCP address', () => {
        const a = server.address();
        this.tcpAddress = a.family === 'IPv6' || a.family === 6 ? `[${a.address}]:${a.port}` : `${a.address}:${a.port}`;
        if (!this.finished) this.writeMetadata('running');
      }),
    );
    server.listen({ host, port, exclusive: true });
  }

  headers(contentType, extra) {
    const h = { 'livecov-instance': this.instance, 'cache-control': 'no-store', ...extra };
    if (contentType) h['content-type'] = contentType;
    return h;
  }

  error(res, status, message, extra) {
    const body = JSON.stringify({ error: message });
    res.writeHead(status, this.headers('application/json', { 'content-length': Buffer.byteLength(body), ...extra }));
    res.end(body);
  }

  ok(res, status, contentType, body, extra) {
    res.writeHead(status, this.headers(contentType, { 'content-length': Buffer.byteLength(body), ...extra }));
    res.end(body);
  }

  /** A request Node.js could not parse: a JSON error when the socket can still take one. */
  clientError(err, socket) {
    if (!socket.writable || err.code === 'ECONNRESET') {
      socket.destroy();
      return;
    }
    const [status, reason, message] =
      err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'Request Header Fields Too Large', `request head over ${LIMITS.maxHeaderBytes} bytes`]
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? [408, 'Request Timeout', 'request not received in time']
          : [400, 'Bad Request', 'malformed HTTP request'];
    const body = JSON.stringify({ error: message });
    socket.end(
      `HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\nlivecov-instance: ${this.instance}\r\n` +
        `cache-control: no-store\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
    );
  }

  authorized(header) {
    if (typeof header !== 'string') return false;
    const m = /^\s*bearer[ \t]+(.*?)[ \t]*$/i.exec(header);
    if (!m) return false;
    // Equal-length digests: the comparison takes the same time whatever the token given.
    return require('node:crypto').timingSafeEqual(digest(m[1]), this.tokenDigest);
  }

  handle(req, res, tcp) {
    if (tcp && this.tokenDigest !== null && !this.authorized(req.headers.authorization)) {
      this.error(res, 401, 'missing or wrong bearer token (Authorization: Bearer <token>)', { 'www-authenticate': 'Bearer' });
      return;
    }
    const url = req.url || '/';
    const q = url.indexOf('?');
    const route = q < 0 ? url : url.slice(0, q);
    const query = q < 0 ? '' : url.slice(q + 1);
    const allow = route === '/coverage' || route === '/health' ? 'GET' : route === '/reset' ? 'POST' : null;
    if (allow === null) {
      this.error(res, 404, `no route ${clip(route)} (routes: ${ROUTES})`);
      return;
    }
    if (req.method !== allow) {
      this.error(res, 405, `method ${clip(req.method)} not allowed on ${route} (allowed: ${allow})`, { allow });
      return;
    }
    if (route === '/health') {
      this.ok(res, 200, 'application/json', this.metadata(this.finished ? 'exited' : 'running'));
    } else if (route === '/coverage') {
      const parsed = parseQuery(query);
      if (parsed.error) {
        this.error(res, 400, parsed.error);
        return;
      }
      const started = process.hrtime.bigint();
      this.lcov(parsed.test, parsed.reset).then(
        (lcov) => {
          const body = parsed.format === 'json' ? summaryJson(lcov) : lcov;
          // The time to make the report, in milliseconds, as every agent says it.
          const took = Number(process.hrtime.bigint() - started) / 1e6;
          const timing = { 'server-timing': `report;dur=${took.toFixed(3)}` };
          this.ok(res, 200, parsed.format === 'json' ? 'application/json' : 'text/plain; charset=utf-8', body, timing);
        },
        (err) => {
          complain('a dump failed', err);
          guarded('cannot answer a request', () => this.error(res, 500, `the dump failed in the livecov hook: ${err && err.message}`));
        },
      );
    } else {
      this.postReset(req, res);
    }
  }

  /** POST /reset: the body (at most 64 KiB) is read and ignored. */
  postReset(req, res) {
    const tooLarge = () => this.error(res, 413, `request body over ${LIMITS.maxBodyBytes} bytes`, { connection: 'close' });
    if (Number(req.headers['content-length'] || 0) > LIMITS.maxBodyBytes) {
      tooLarge();
      req.resume();
      return;
    }
    let size = 0;
    let done = false;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > LIMITS.maxBodyBytes && !done) {
        done = true;
        guarded('cannot answer POST /reset', tooLarge);
      }
    });
    req.on('error', () => {
      done = true;
    });
    req.on('end', () => {
      if (done) return;
      done = true;
      this.hub.totals(true).then(
        () => {
          res.writeHead(204, this.headers(null, {}));
          res.end();
        },
        (err) => {
          complain('reset failed', err);
          guarded('cannot answer POST /reset', () => this.error(res, 500, `reset failed: ${err.message}`));
        },
      );
    });
  }
}

// node:crypto is loaded only with a token: it costs a start several milliseconds.
function digest(text) {
  return require('node:crypto').createHash('sha256').update(text, 'utf8').digest();
}

/** 16 hex digits for the instance id: unique, not secret (Math.random is seeded afresh in every process). */
function randomHex() {
  const part = () => Math.floor(Math.random() * 0x100000000).toString(16).padStart(8, '0');
  return part() + part();
}

function clip(s) {
  return [...String(s)].slice(0, 100).join('');
}

/** The query of GET /coverage, as the native agents read it: unknown, repeated or invalid parameters are a 400. */
function parseQuery(query) {
  const out = { test: null, reset: false, format: 'lcov' };
  const seen = new Set();
  for (const pair of query.split('&').filter((p) => p !== '')) {
    const eq = pair.indexOf('=');
    let key;
    let value;
    try {
      key = decodeURIComponent((eq < 0 ? pair : pair.slice(0, eq)).replace(/\+/g, ' '));
      value = decodeURIComponent((eq < 0 ? '' : pair.slice(eq + 1)).replace(/\+/g, ' '));
    } catch {
      return { error: 'invalid percent-encoding in the query' };
    }
    if (!['test', 'reset', 'format'].includes(key)) {
      return { error: `unknown query parameter ${JSON.stringify(clip(key))} (valid: test, reset, format)` };
    }
    if (seen.has(key)) return { error: `query parameter ${key} given more than once` };
    seen.add(key);
    if (key === 'test') {
      // eslint-disable-next-line no-control-regex
      if (/[\u0000-\u001f\u007f-\u009f]/.test(value)) return { error: 'test name must not contain control characters' };
      out.test = value === '' ? null : value;
    } else if (key === 'reset') {
      if (value === '1' || value === 'true') out.reset = true;
      else if (value === '0' || value === 'false') out.reset = false;
      else return { error: `invalid reset value ${JSON.stringify(clip(value))} (valid: 1, true, 0, false)` };
    } else if (value === 'profraw') {
      return { error: 'format=profraw is only served by LLVM-instrumented processes; this is a Node.js process (valid here: lcov, json)' };
    } else if (value === 'lcov' || value === 'json') {
      out.format = value;
    } else {
      return { error: `invalid format ${JSON.stringify(clip(value))} (valid: lcov, json)` };
    }
  }
  return out;
}

// ------------------------------------------------------------------ start

function boot() {
  const marker = Symbol.for('livecov.hook');
  if (globalThis[marker]) return;
  globalThis[marker] = true;
  const wt = require('node:worker_threads');
  if (!wt.isMainThread) {
    // A worker thread sends its counts to the main thread's hook, when there is one (not with the worker's env alone).
    const shared = wt.getEnvironmentData(WORKER_DATA_KEY);
    if (shared !== undefined) workerBoot(shared);
    return;
  }
  const config = readConfig(process.env);
  if (config === null) return;
  const useSourceMaps = config.sourceMaps && typeof process.setSourceMapsEnabled === 'function';
  if (useSourceMaps) process.setSourceMapsEnabled(true);
  const reportable = (url) => {
    const file = urlToPath(url);
    return file !== null && file !== __filename && !config.ignore.test(file);
  };
  const collector = new Collector(require('node:inspector'));
  collector.start();
  let hook;
  try {
    hook = new Hook(config, collector, reportable, useSourceMaps);
    hook.start();
  } catch (err) {
    // Not started: V8 stops counting, the program runs as without the hook.
    guarded('cannot stop the coverage', () => collector.stop());
    if (hook !== undefined) guarded('cannot close the channel of worker threads', () => hook.hub.close());
    throw err;
  }
  // From now on every worker thread the program starts sends its counts to this thread.
  wt.setEnvironmentData(WORKER_DATA_KEY, { instance: hook.instance, sourceMaps: useSourceMaps });
  watchWorkers((thread) => {
    hook.hub.drain();
    hook.hub.gone(thread);
  });
}

try {
  boot();
} catch (err) {
  complain('not started', err);
}
