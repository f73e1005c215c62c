//! Audio decoding on the decode threads: the `Audio` columns `datasets` stores (`{bytes,
//! path}` structs, or plain bytes) become `{array, sampling_rate, path}` structs, as
//! `datasets`' `Audio` feature decodes a cell, with no FFmpeg: containers and codecs by
//! symphonia (WAV/PCM, FLAC, MP3, Ogg Vorbis, AAC and ALAC in MP4), resampling by
//! rubato's FFT resampler.
//!
//! `array` is float32, samples scaled to [-1, 1) as libsndfile and FFmpeg scale them.
//! With `num_channels` unset (or 1) it is one channel, `(samples,)`: the channels'
//! mean, as `datasets`' `["array"]` gives it. With `num_channels=N > 1` it is
//! `(N, samples)`, channel after channel (torchcodec's layout); a mono clip is
//! repeated in each. Resampling to the feature's `sampling_rate` happens after.
//!
//! No clip may decode to more than 512 MiB of samples (the bound images have too); a
//! clip that does not decode (truncated, a lying header, no audio, a codec not built in,
//! Opus among them) is its row's `DecodeError`, or under `on_error="skip"` a skipped row.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{Array, ArrayRef, Int32Array, StructArray};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use rubato::Resampler;
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::codecs::audio::well_known::CODEC_ID_OPUS;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use super::cells::{
    CellDecoder, Outcomes, cell_bytes, guarded, map_on_pool, media_bytes_type, nulls_of,
};
use super::hf_features::media_columns;
use super::{OnError, variable_tensor_field};
use crate::error::{Error, Result};

/// The most samples (all channels) one clip may decode to: 512 MiB of float32.
const MAX_SAMPLES: usize = (512 << 20) / 4;

/// How one column decodes: `datasets`' `Audio(sampling_rate, num_channels)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioFeature {
    /// Resample to this rate; `None`: keep the clip's own.
    pub sampling_rate: Option<u32>,
    /// `None` or 1: the channels' mean; `N`: `N` channels.
    pub num_channels: Option<u16>,
}

impl AudioFeature {
    /// Dimensions of `array`: 1 (samples) or 2 (channels, samples).
    fn channels_kept(&self) -> Option<usize> {
        self.num_channels.map(usize::from).filter(|&n| n > 1)
    }
}

/// The `Audio` columns of a dataset and how each decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioSpec {
    by_column: BTreeMap<String, AudioFeature>,
}

impl AudioSpec {
    /// The `Audio` columns of the features `datasets` wrote (the `huggingface` metadata
    /// key's JSON), decoded as `datasets` decodes them on access; none where `decode` is
    /// false. `None` where there are none among the columns read (`schema`).
    pub fn from_features(huggingface: &str, schema: &Schema) -> Option<Self> {
        let by_column: BTreeMap<String, AudioFeature> = media_columns(huggingface, schema, "Audio")
            .into_iter()
            .map(|(name, f)| {
                let number = |key: &str| f.get(key).and_then(|v| v.as_u64());
                let feature = AudioFeature {
                    sampling_rate: number("sampling_rate").map(|r| r.min(u32::MAX as u64) as u32),
                    num_channels: number("num_channels").map(|n| n.min(u16::MAX as u64) as u16),
                };
                (name, feature)
            })
            .collect();
        (!by_column.is_empty()).then_some(AudioSpec { by_column })
    }

    /// Resolves the spec against the schema read: the decoded columns' places and types.
    pub fn bind(&self, schema: &SchemaRef, on_error: OnError) -> Result<AudioDecode> {
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut columns = Vec::new();
        for (name, feature) in &self.by_column {
            let Ok(index) = schema.index_of(name) else {
                continue;
            };
            let field = schema.field(index);
            if !media_bytes_type(field.data_type()) {
                return Err(Error::invalid_argument(format!(
                    "column {name:?} ({}) holds no audio bytes",
                    field.data_type()
                )));
            }
            if feature.sampling_rate == Some(0) || feature.num_channels == Some(0) {
                return Err(Error::invalid_argument(format!(
                    "column {name:?}: an Audio feature's sampling_rate and num_channels are positive"
                )));
            }
            fields[index] = Field::new(name, DataType::Struct(clip_fields(feature)), true);
            columns.push((index, *feature));
        }
        Ok(AudioDecode {
            columns,
            on_error,
            schema: Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        })
    }
}

/// A decoded clip's fields, as `datasets` gives a cell: `array`, `sampling_rate`, `path`.
fn clip_fields(feature: &AudioFeature) -> Fields {
    let array = match feature.channels_kept() {
        Some(channels) => {
            variable_tensor_field("array", DataType::Float32, &[Some(channels), None])
        }
        None => variable_tensor_field("array", DataType::Float32, &[None]),
    };
    vec![
        array,
        Field::new("sampling_rate", DataType::Int32, true),
        Field::new("path", DataType::Utf8, true),
    ]
    .into()
}

/// Decodes a prepared dataset's `Audio` columns; see the module docs.
#[derive(Debug)]
pub struct AudioDecode {
    columns: Vec<(usize, AudioFeature)>,
    on_error: OnError,
    schema: SchemaRef,
}

/// One decoded clip: `channels` planes of `frames` samples each, one after another.
struct Clip {
    samples: Vec<f32>,
    channels: usize,
    frames: usize,
    rate: u32,
}

/// Decodes a whole clip into float32 samples: its planes one after another, or with
/// `mix` their mean (summed in order, then divided, as numpy's `mean` over float32), mixed
/// packet by packet so that the planes are never held whole.
fn decode_clip(bytes: &[u8], mix: bool) -> std::result::Result<Clip, String> {
    let source = MediaSourceStream::new(Box::new(std::io::Cursor::new(bytes)), Default::default());
    let mut format = symphonia::default::get_probe()
        .probe(
            &Hint::new(),
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| {
            format!("not an audio file shardflow reads (WAV, FLAC, MP3, Ogg, MP4): {e}")
        })?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or("the file holds no audio track")?;
    let track_id = track.id;
    // The frames the header says the clip has, to allocate once; a header may lie, so
    // no more than the bytes could hold (64 samples a byte is past any codec's ratio
    // at a bitrate worth storing) and the clip's bound: past that, the planes grow.
    let expected = track
        .num_frames
        .map_or(0, |n| (n as usize).min(bytes.len() * 64).min(MAX_SAMPLES));
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or("the audio track has no codec parameters")?
        .clone();
    if params.codec == CODEC_ID_OPUS {
        return Err(
            "Opus audio: shardflow does not decode Opus yet (no mature pure-Rust decoder)".into(),
        );
    }
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| {
            format!(
                "a codec shardflow does not decode ({:?}): {e}",
                params.codec
            )
        })?;
    // Each packet's channels go straight to the ends of `planes`; when mixing, the first
    // to the end of the mix and the others to `to_add` (reused), then added in.
    let mut to_add: Vec<Vec<f32>> = Vec::new();
    let mut planes: Vec<Vec<f32>> = Vec::new();
    let mut channels = 0;
    let mut rate = params.sample_rate;
    let mut total = 0usize;
    while let Some(packet) = format.next_packet().map_err(|e| e.to_string())? {
        if packet.track_id != track_id {
            continue;
        }
        let decoded = decoder.decode(&packet).map_err(|e| e.to_string())?;
        let packet_channels = decoded.spec().channels().count();
        if channels == 0 {
            channels = packet_channels;
            let kept = if mix { 1 } else { channels };
            planes = (0..kept).map(|_| Vec::with_capacity(expected)).collect();
            to_add = vec![Vec::new(); channels - kept.min(channels)];
            rate = rate.or(Some(decoded.spec().rate()));
        } else if packet_channels != channels {
            return Err(format!(
                "the channel count changes from {channels} to {packet_channels} within the clip"
            ));
        }
        let frames = decoded.frames();
        total += frames * channels;
        if total > MAX_SAMPLES {
            return Err(format!(
                "more than {MAX_SAMPLES} samples decoded (512 MiB): longer than a clip shardflow decodes"
            ));
        }
        let start = planes.first().map_or(0, Vec::len);
        for plane in &mut planes {
            plane.resize(start + frames, 0.0);
        }
        for plane in &mut to_add {
            plane.resize(frames, 0.0);
        }
        let mut tails: Vec<&mut [f32]> = planes
            .iter_mut()
            .map(|plane| &mut plane[start..])
            .chain(to_add.iter_mut().map(|plane| &mut plane[..]))
            .collect();
        decoded.copy_to_slice_planar::<f32, _>(&mut tails);
        if !to_add.is_empty() {
            let mixed = &mut planes[0][start..];
            for plane in &to_add {
                mixed.iter_mut().zip(plane).for_each(|(m, s)| *m += s);
            }
            let n = channels as f32;
            mixed.iter_mut().for_each(|m| *m /= n);
        }
    }
    let rate = rate
        .filter(|&r| r > 0)
        .ok_or("the clip has no sample rate")?;
    let frames = planes.first().map_or(0, Vec::len);
    let samples = match planes.len() {
        1 => planes.pop().unwrap_or_default(),
        _ => planes.concat(),
    };
    Ok(Clip {
        samples,
        channels: if mix { 1 } else { channels },
        frames,
        rate,
    })
}

impl Clip {
    /// The clip in `feature`'s channels, decoded as `decode_clip` was asked: mixed to one
    /// already, or its channels kept (a mono clip repeated).
    fn to_channels(self, feature: &AudioFeature) -> std::result::Result<Self, String> {
        let wanted = feature.channels_kept().unwrap_or(1);
        if wanted == self.channels {
            return Ok(self);
        }
        if self.channels == 1 {
            return Ok(Clip {
                samples: self.samples.repeat(wanted),
                channels: wanted,
                ..self
            });
        }
        Err(format!(
            "num_channels={wanted} from a clip of {} channels: shardflow mixes channels only down to one",
            self.channels
        ))
    }

    /// The clip at `rate`: rubato's FFT resampler, its start-up delay trimmed, the
    /// output `ceil(frames * rate / own rate)` frames long.
    fn resampled(self, rate: u32) -> std::result::Result<Self, String> {
        if rate == self.rate || self.frames == 0 {
            return Ok(Clip { rate, ..self });
        }
        let (channels, frames) = (self.channels, self.frames);
        // The FFT blocks are a whole number of the rates' smallest common blocks, and an
        // even number of samples in and out: the resampler's delay (half a block) is then
        // a whole number of output samples, trimmed exactly. (With odd blocks, 441 in
        // for 44.1 kHz to 16 kHz, the output is half an input sample late.)
        let gcd = gcd(self.rate, rate) as usize;
        let (smallest_in, smallest_out) = (self.rate as usize / gcd, rate as usize / gcd);
        let mut blocks = 512usize.div_ceil(smallest_in);
        if smallest_in % 2 == 1 || smallest_out % 2 == 1 {
            blocks += blocks % 2;
        }
        let smallest = smallest_in;
        let mut resampler = rubato::Fft::<f32>::new_custom(
            self.rate as usize,
            rate as usize,
            blocks * smallest,
            1,
            channels,
            rubato::WindowFunction::BlackmanHarris2,
            rubato::FixedSync::Input,
        )
        .map_err(|e| format!("resampling {} Hz to {rate} Hz: {e}", self.rate))?;
        let needed = resampler.process_all_needed_output_len(frames);
        if needed.saturating_mul(channels) > MAX_SAMPLES {
            return Err(format!(
                "resampled to {rate} Hz, the clip is more than {MAX_SAMPLES} samples"
            ));
        }
        let input = rubato::audioadapter_buffers::direct::SequentialSlice::new(
            &self.samples,
            channels,
            frames,
        )
        .map_err(|e| e.to_string())?;
        let mut out = vec![0f32; needed * channels];
        let mut output = rubato::audioadapter_buffers::direct::SequentialSlice::new_mut(
            &mut out, channels, needed,
        )
        .map_err(|e| e.to_string())?;
        let (_, produced) = resampler
            .process_all_into_buffer(&input, &mut output, frames, None)
            .map_err(|e| format!("resampling {} Hz to {rate} Hz: {e}", self.rate))?;
        // Each plane's first `produced` samples, moved down in place.
        for channel in 1..channels {
            out.copy_within(
                channel * needed..channel * needed + produced,
                channel * produced,
            );
        }
        out.truncate(channels * produced);
        Ok(Clip {
            samples: out,
            channels,
            frames: produced,
            rate,
        })
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl AudioDecode {
    /// One cell decoded as `feature` says.
    fn decode_one(
        &self,
        bytes: &[u8],
        feature: &AudioFeature,
    ) -> std::result::Result<Clip, String> {
        let clip = decode_clip(bytes, feature.channels_kept().is_none())?.to_channels(feature)?;
        match feature.sampling_rate {
            Some(rate) => clip.resampled(rate),
            None => Ok(clip),
        }
    }
}

impl CellDecoder for AudioDecode {
    fn media(&self) -> &'static str {
        "audio"
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn on_error(&self) -> OnError {
        self.on_error
    }

    fn columns(&self) -> Vec<usize> {
        self.columns.iter().map(|(index, _)| *index).collect()
    }

    fn decode_column(
        &self,
        index: usize,
        column: &ArrayRef,
    ) -> std::result::Result<(ArrayRef, Outcomes), String> {
        let feature = self
            .columns
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, f)| *f)
            .ok_or("not an audio column")?;
        let input = cell_bytes(column, "audio")?;
        let paths: Option<ArrayRef> = column
            .as_struct_opt()
            .and_then(|cells| cells.column_by_name("path"))
            .map(|p| arrow_cast::cast(p, &DataType::Utf8))
            .transpose()
            .map_err(|e| e.to_string())?;
        let clips: Vec<std::result::Result<Option<Clip>, String>> =
            map_on_pool(input.len(), |row| match input.is_null(row) {
                true => Ok(None),
                false => guarded(|| self.decode_one(input.value(row), &feature)).map(Some),
            });
        let kept = feature.channels_kept();
        let rates: Int32Array = clips
            .iter()
            .map(|c| {
                c.as_ref()
                    .ok()
                    .and_then(|c| c.as_ref())
                    .map(|c| c.rate as i32)
            })
            .collect();
        let rows = clips
            .into_iter()
            .map(|clip| {
                clip.map(|c| {
                    c.map(|c| {
                        let shape = match kept {
                            Some(_) => vec![c.channels as i32, c.frames as i32],
                            None => vec![c.frames as i32],
                        };
                        (c.samples, shape)
                    })
                })
            })
            .collect();
        let empty: &[i32] = match kept {
            Some(channels) => &[channels as i32, 0],
            None => &[0],
        };
        let nulls = nulls_of(&input);
        let (array, outcomes) =
            super::variable_tensor_column::<Float32Type>(rows, empty, nulls.clone())?;
        let fields = clip_fields(&feature);
        let paths =
            paths.unwrap_or_else(|| arrow_array::new_null_array(&DataType::Utf8, input.len()));
        let cells =
            StructArray::try_new(fields, vec![Arc::new(array), Arc::new(rates), paths], nulls)
                .map_err(|e| e.to_string())?;
        Ok((Arc::new(cells), outcomes))
    }
}
