"""Concurrent requests share encode_batch calls, and each gets exactly what it would alone."""
import asyncio
import os
from concurrent.futures import ThreadPoolExecutor


from laya_grpc.core.errors import LayaError
from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.tokenizer.encoding import EncodeJob, TextEncoder
from laya_grpc.tokenizer.microbatch import MicroBatcher

Q = parse_questions({"a": {"type": "choice", "instructions": "pick one", "criteria": ["x", "y", "z"]},
                     "b": {"type": "noul", "instructions": "is it so?"}})


def test_concurrent_jobs_batch_and_match_single_encoding(tiny_ckpt):
    enc = TextEncoder(os.path.join(tiny_ckpt, "tokenizer"), max_len=512, head_max_len=192)
    jobs = [EncodeJob(["state number %d " % i * (i + 1)], Q, None if i % 3 else 64, None) for i in range(24)]
    bad = EncodeJob(["x"], Q, 3, None)   # max_len 3: option markers cannot fit -> 422 for this job only

    async def go():
        mb = MicroBatcher(enc, ThreadPoolExecutor(2))
        outs = await asyncio.gather(*[mb.encode(j) for j in jobs[:12] + [bad] + jobs[12:]],
                                    return_exceptions=True)
        return mb, outs
    mb, outs = asyncio.run(go())
    assert isinstance(outs[12], LayaError) and "option markers fit" in outs[12].detail
    outs = outs[:12] + outs[13:]
    assert mb.batches < len(jobs)
    for job, out in zip(jobs, outs):
        alone = enc.encode_many(job.states, job.questions, job.max_len, job.head_max_len)
        assert [(r.ids, r.markers, r.qtype) for r in out[0].rows] == [(r.ids, r.markers, r.qtype) for r in alone[0].rows]
        assert out[0].usage == alone[0].usage
